import unittest

from cluster import has_torch, launch, python_worker

if has_torch():
    import torch
    from shardps.torch import _named


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
class ZeroGradTest(unittest.TestCase):
    def test_zero_grad_between_backward_and_step_leaves_the_pushed_gradient_alone(self):
        run = launch(1, 1, python_worker("torch_misuse_worker.py"), timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("[0] ok: the gradient on the wire is untouched: True", run.stdout)
        self.assertIn("[0] ok: no gradient is left for the next step: True", run.stdout)
        self.assertIn("[0] ok: the take-over is announced: True", run.stdout)
        self.assertIn("[0] ok: one push per parameter a step: True", run.stdout)
        self.assertIn("[0] ok: the earlier optimizer refuses to step: True", run.stdout)


if __name__ == "__main__":
    unittest.main()
