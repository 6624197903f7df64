import unittest

from cluster import has_torch, launch, python_worker

if has_torch():
    import torch
    from shardps.torch import _named, _refuse_closure_steps, _refuse_compressed_momentum


@unittest.skipUnless(has_torch(), "torch is not installed")
class NamedParametersTest(unittest.TestCase):
    def test_duplicate_names_are_named(self):
        a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
        with self.assertRaisesRegex(ValueError, "duplicate names: x"):
            _named([("x", a), ("x", b)], None)

    def test_one_parameter_under_two_names_is_refused(self):
        a = torch.nn.Parameter(torch.zeros(2))
        with self.assertRaisesRegex(ValueError, "one parameter under two names: 'x' and 'y'"):
            _named([("x", a), ("y", a)], None)

    def test_a_parameter_of_the_optimizer_left_unnamed_is_refused(self):
        a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3, 4))
        with self.assertRaisesRegex(ValueError, r"leaves out 1 of the optimizer's parameters \(param_groups\[0\] #1 "
                                                r"\(3, 4\)\)"):
            _named([("a", a)], torch.optim.SGD([a, b], lr=0.1))

    def test_a_frozen_parameter_of_the_optimizer_may_go_unnamed(self):
        a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3), requires_grad=False)
        self.assertEqual(len(_named([("a", a)], torch.optim.SGD([a, b], lr=0.1))), 1)

    def test_a_shared_parameter_of_a_model_is_listed_once(self):
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        model[1].weight = model[0].weight
        self.assertEqual(len(_named(model.named_parameters(), None)), 3)


@unittest.skipUnless(has_torch(), "torch is not installed")
class ClosureStepTest(unittest.TestCase):
    def test_an_optimizer_that_evaluates_its_closure_each_step_is_refused_naming_it(self):
        a = torch.nn.Parameter(torch.zeros(2))
        with self.assertRaisesRegex(ValueError, r"LBFGS.step\(\) needs a closure it evaluates several times"):
            _refuse_closure_steps(torch.optim.LBFGS([a]))
        for optimizer in (torch.optim.SGD([a], lr=0.1), torch.optim.Adam([a])):
            _refuse_closure_steps(optimizer)  # steps on one gradient


@unittest.skipUnless(has_torch(), "torch is not installed")
class ZeroGradTest(unittest.TestCase):
    def test_zero_grad_between_backward_and_step_leaves_the_pushed_gradient_alone(self):
        run = launch(1, 1, python_worker("torch_misuse_worker.py"), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("[0] ok: the gradient on the wire is untouched: True", run.stdout)
        self.assertIn("[0] ok: no gradient is left for the next step: True", run.stdout)
        self.assertIn("[0] ok: the take-over is announced: True", run.stdout)
        self.assertIn("[0] ok: one push per parameter a step: True", run.stdout)
        self.assertIn("[0] ok: the earlier optimizer refuses to step: True", run.stdout)



@unittest.skipUnless(has_torch(), "torch is not installed")
class StateDictTest(unittest.TestCase):
    def test_a_state_dict_with_buffers_and_a_scalar_parameter_is_broadcast_trained_and_keeps_its_shapes(self):
        run = launch(1, 2, python_worker("torch_state_dict_worker.py"), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        for rank in (0, 1):
            self.assertIn("[%d] ok: buffers broadcast: True" % rank, run.stdout)
            self.assertIn("[%d] ok: scalar broadcast: True" % rank, run.stdout)
            self.assertIn("[%d] ok: a changed shape is refused: True" % rank, run.stdout)
        results = sorted(line.split("] ", 1)[1] for line in run.stdout.splitlines() if "] scale " in line)
        self.assertEqual(len(results), 2, run.stdout)
        self.assertEqual(results[0], results[1])  # sync: the same weights on both workers
        self.assertNotIn("scale 1.000000", results[0])  # the scalar parameter was trained


# The fields a worker reads for `--set compression.codec=2bit` (1-bit Adam's recipe), as
# Worker.config_field gives them.
RECIPE = {
    "optimizer.kind": "ADAM",
    "optimizer.freeze_variance_after": "150",
    "compression.codec": "2bit:scale=1",
    "compression.tensor_codecs": "",
}


def fields(**changes):
    """Worker.config_field over RECIPE with `changes` (dots as "__")."""
    values = dict(RECIPE, **{k.replace("__", "."): v for k, v in changes.items()})
    return values.__getitem__


@unittest.skipUnless(has_torch(), "torch is not installed")
class CompressedMomentumTest(unittest.TestCase):
    """Sum-only DistributedOptimizer steps the torch optimizer on mean gradients, which a
    frozen-variance Adam's compressed rounds (momenta) cannot give."""

    def test_the_recipe_of_a_plain_lossy_codec_is_refused_naming_the_way_out(self):
        with self.assertRaisesRegex(ValueError,
                                    "freezes Adam's variance after 150 rounds.*update_mode=UPDATE_ON_SERVER"):
            _refuse_compressed_momentum(fields(), {})

    def test_a_tensor_codec_counts(self):
        with self.assertRaises(ValueError):
            _refuse_compressed_momentum(fields(compression__codec="none",
                                               compression__tensor_codecs="a=none\nw=onebit\n"), {})
        with self.assertRaises(ValueError):
            _refuse_compressed_momentum(fields(compression__codec="none"), {"w": "topk:ratio=0.1"})

    def test_no_codec_another_optimizer_or_no_freeze_is_accepted(self):
        _refuse_compressed_momentum(fields(compression__codec="none", compression__tensor_codecs="w=none\n"), {})
        _refuse_compressed_momentum(fields(optimizer__kind="SGD"), {})
        _refuse_compressed_momentum(fields(optimizer__freeze_variance_after="0"), {})

    def test_a_cluster_with_the_recipe_refuses_at_once(self):
        run = launch(1, 1, python_worker("torch_recipe_worker.py"), sets=["compression.codec=2bit"], timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("[0] refused: the cluster freezes Adam's variance after 150 rounds", run.stdout)

    def test_sum_only_set_by_hand_keeps_the_torch_optimizer(self):
        run = launch(1, 1, python_worker("torch_recipe_worker.py"), sets=["compression.codec=2bit",
                                                                           "update_mode=SUM_ONLY"], timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("[0] accepted", run.stdout)


if __name__ == "__main__":
    unittest.main()
