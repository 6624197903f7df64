import unittest

import cluster  # noqa: F401  (puts this checkout's package on the path)
from shardps import environment


class EnvironmentTest(unittest.TestCase):
    def test_a_rendezvous_timeout_that_is_not_positive_seconds_names_its_source(self):
        self.assertEqual(environment.rendezvous_timeout(None, {}), 60.0)
        self.assertEqual(environment.rendezvous_timeout(None, {"SHARDPS_RENDEZVOUS_TIMEOUT": "2.5"}), 2.5)
        for env in ({"SHARDPS_RENDEZVOUS_TIMEOUT": "abc"}, {"SHARDPS_RENDEZVOUS_TIMEOUT": "-1"},
                    {"SHARDPS_RENDEZVOUS_TIMEOUT": "nan"}):
            with self.assertRaisesRegex(ValueError, "SHARDPS_RENDEZVOUS_TIMEOUT"):
                environment.rendezvous_timeout(None, env)
        with self.assertRaisesRegex(ValueError, r"\(argument\) 0"):
            environment.rendezvous_timeout(0, {})

    def test_arguments_win_over_the_environment(self):
        env = {"SHARDPS_SCHEDULER": "a:1", "SHARDPS_RANK": "3"}
        self.assertEqual(environment.scheduler_address("b:2", env), ("b:2", "argument"))
        self.assertEqual(environment.worker_rank(5, env), (5, "argument"))

    def test_shardps_variables_come_first(self):
        env = {"SHARDPS_SCHEDULER": "a:1", "DMLC_PS_ROOT_URI": "b", "DMLC_PS_ROOT_PORT": "2",
               "SHARDPS_RANK": "3", "RANK": "4"}
        self.assertEqual(environment.scheduler_address(None, env)[0], "a:1")
        self.assertEqual(environment.worker_rank(None, env)[0], 3)

    def test_launchers_variables_are_read(self):
        dmlc = {"DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000", "DMLC_WORKER_ID": "2"}
        self.assertEqual(environment.scheduler_address(None, dmlc)[0], "10.0.0.1:9000")
        self.assertEqual(environment.worker_rank(None, dmlc), (2, "DMLC_WORKER_ID"))
        self.assertEqual(environment.worker_rank(None, {"RANK": "1"}), (1, "RANK"))
        self.assertEqual(environment.worker_rank(None, {"SLURM_PROCID": "6"}), (6, "SLURM_PROCID"))
        self.assertEqual(environment.worker_rank(None, {"JOB_COMPLETION_INDEX": "4"}), (4, "JOB_COMPLETION_INDEX"))
        self.assertEqual(environment.local_rank({"SLURM_LOCALID": "1"}), 1)
        self.assertEqual(environment.local_rank({}), 0)

    def test_missing_or_bad_values_say_what_to_set(self):
        with self.assertRaisesRegex(ValueError, "SHARDPS_SCHEDULER"):
            environment.scheduler_address(None, {})
        with self.assertRaisesRegex(ValueError, "SHARDPS_RANK"):
            environment.worker_rank(None, {})
        with self.assertRaisesRegex(ValueError, "RANK='x' is not an integer"):
            environment.worker_rank(None, {"RANK": "x"})


if __name__ == "__main__":
    unittest.main()
