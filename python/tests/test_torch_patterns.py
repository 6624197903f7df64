"""Patterns of real training scripts (torch_patterns_worker.py) on a sync 1 x 2 cluster: each
trains as one process would on the combined batches, or is refused at once saying what to do."""

import os
import tempfile
import unittest

from cluster import has_torch, launch, python_worker

if has_torch():
    import torch
    from torch import nn
    import torch_job
    import torch_patterns_job

WORKERS = 2
STEPS = 8  # torch_patterns_worker's


def reference(case):
    """One process on the workers' combined batches, doing what the worker's case does."""
    if case in ("parameter-list", "sparse", "model-zero"):
        return reference_of_model(case)
    model = torch_job.make_model(seed=1)
    if case in ("frozen", "frozen-model"):
        model[4].requires_grad_(False)
    if case in ("frozen", "frozen-model", "resume"):
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.1) if case == "schedule" else None
    for step in range(2 * STEPS if case == "resume" else STEPS):
        if case in ("frozen", "frozen-model") and step in (3, 6):
            model[0].requires_grad_(step == 6)
            model[4].requires_grad_(step == 6)
        parts = [torch_job.batch(step, r) for r in range(WORKERS)]
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        optimizer.zero_grad(set_to_none=True)
        if case == "raised" and step == 2:  # the exception came before the first layer's gradients
            hidden = model[:2](x).detach()
            nn.functional.cross_entropy(model[2:](hidden), y).backward()
        else:
            nn.functional.cross_entropy(model(x), y).backward()
        if case == "clip-sync":
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        optimizer.step()
        if case == "clamp":
            with torch.no_grad():
                for p in model.parameters():
                    p.clamp_(-0.1, 0.1)
        if schedule:
            schedule.step()
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def reference_of_model(case):
    """reference() of the cases with a model of their own (SGD at 0.1)."""
    torch.manual_seed(1)
    if case == "sparse":
        model = nn.Sequential(nn.EmbeddingBag(50, 8, sparse=True), nn.Linear(8, 3))
    elif case == "model-zero":
        model = torch_patterns_job.wide_model()
    else:
        model = torch_patterns_job.ListNet()
        model.skip.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        if case == "sparse":
            x, y = torch_patterns_job.sparse_batch(step, None)
        else:
            parts = [torch_job.batch(step, r) for r in range(WORKERS)]
            x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


@unittest.skipUnless(has_torch(), "torch is not installed for this interpreter (Debian: python3-torch)")
class TorchPatternsTest(unittest.TestCase):
    def run_case(self, case, sets=(), servers_optimizer=("optimizer.kind=SGD", "optimizer.learning_rate=0.1"),
                 out=None):
        with tempfile.TemporaryDirectory() as scratch:
            out = out or scratch
            run = launch(1, WORKERS, python_worker("torch_patterns_worker.py", case, out),
                         sets=["consistency=sync"] + list(servers_optimizer) + list(sets), timeout=60)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            saved = os.path.join(out, "rank0.pt")
            self.weights = torch.load(saved) if os.path.exists(saved) else None
        for line in run.stdout.splitlines():
            if "] ok: " in line:
                self.assertTrue(line.endswith(": True"), run.stdout)
        return run.stdout

    def assert_matches_reference(self, case, tolerance=1e-5):
        expected = reference(case)
        self.assertIsNotNone(self.weights)
        for name, want in expected.items():
            relative = ((self.weights[name] - want).norm() / want.norm()).item()
            self.assertLess(relative, tolerance, "%s: relative difference %g" % (name, relative))

    def refusals(self, out, rank=0):
        return [line.split("refused: ", 1)[1] for line in out.splitlines() if line.startswith("[%d] refused: " % rank)]

    def test_a_frozen_parameter_keeps_its_weights_on_the_servers_adam_and_trains_once_unfrozen(self):
        out = self.run_case("frozen", servers_optimizer=("optimizer.kind=ADAM", "optimizer.learning_rate=0.01"))
        self.assertEqual(out.count("ok: "), 8, out)
        self.assertNotIn("warned", out)
        self.assert_matches_reference("frozen")

    def test_a_frozen_parameter_in_sum_only_keeps_its_weights_and_steps_as_one_process_does(self):
        # The torch optimizer steps on the workers: a frozen step lands no mean gradient in p.grad.
        out = self.run_case("frozen", sets=["update_mode=SUM_ONLY"])
        self.assertEqual(out.count("ok: "), 8, out)
        self.assert_matches_reference("frozen")

    def test_a_frozen_parameter_with_forward_waits_trains_as_one_process_does(self):
        # With model=, step() returns at once: a frozen step's request is completed at the next
        # step, apart from the landing the next forward does.
        out = self.run_case("frozen-model", servers_optimizer=("optimizer.kind=ADAM", "optimizer.learning_rate=0.01"))
        self.assertEqual(out.count("ok: "), 4, out)
        self.assert_matches_reference("frozen-model")

    def test_a_frozen_parameter_in_async_sends_nothing_and_keeps_its_weights(self):
        # No round waits for it there: the library refuses skip_round, and nothing is sent.
        out = self.run_case("frozen-async", sets=["consistency=async"])
        self.assertEqual(out.count("ok: "), 4, out)
        self.assertNotIn("warned", out)

    def test_a_frozen_parameter_keeps_pace_so_every_checkpoint_completes(self):
        # Frozen steps take part in their rounds without a gradient: every partition reaches
        # each checkpoint round, so the server writes each round's manifest (before, none from
        # the first frozen step on).
        with tempfile.TemporaryDirectory() as checkpoints:
            out = self.run_case("frozen", servers_optimizer=("optimizer.kind=ADAM", "optimizer.learning_rate=0.01"),
                                sets=["checkpoint.dir=" + checkpoints, "checkpoint.every_rounds=2"])
            manifests = sorted(r for r in os.listdir(checkpoints)
                               if any(f.endswith(".manifest") for f in os.listdir(os.path.join(checkpoints, r))))
        self.assertEqual(out.count("ok: "), 8, out)
        self.assertNotIn("warned", out)
        self.assertEqual(manifests, ["round-%012d" % r for r in (2, 4, 6, 8)])
        self.assert_matches_reference("frozen")

    def test_a_gradient_clipped_after_backward_pushed_it_is_refused_on_the_servers_optimizer(self):
        out = self.run_case("clip")
        self.assertRegex(self.refusals(out)[0], r"^the gradient of '[0-9.a-z]+' changed after backward\(\) pushed it "
                                                r"\(clip_grad_norm_.*use update_mode=SUM_ONLY and call synchronize\(\)")

    def test_sum_only_clips_the_averaged_gradient_after_synchronize_as_one_process_does(self):
        self.run_case("clip-sync", sets=["update_mode=SUM_ONLY"])
        self.assert_matches_reference("clip-sync")

    def test_sum_only_a_clip_without_synchronize_is_refused(self):
        out = self.run_case("clip", sets=["update_mode=SUM_ONLY"])
        self.assertIn("the servers average it as it was pushed; call synchronize() after backward()",
                      self.refusals(out)[0])

    def test_weights_changed_in_place_between_steps_are_refused_on_the_servers_optimizer(self):
        out = self.run_case("clamp")
        self.assertRegex(self.refusals(out)[0], r"^the weights of '[0-9.a-z]+' were changed on this worker since the "
                                                r"servers' last answer")
        self.assertIn("[0] at step 1", out)

    def test_sum_only_keeps_weights_clipped_in_place_as_one_process_does(self):
        self.run_case("clamp", sets=["update_mode=SUM_ONLY"])
        self.assert_matches_reference("clamp")

    def test_an_lr_scheduler_takes_the_optimizer_and_steps_the_torch_optimizer_in_sum_only(self):
        self.run_case("schedule", sets=["update_mode=SUM_ONLY"])
        self.assert_matches_reference("schedule")

    def test_an_lr_schedule_the_servers_would_not_follow_is_refused_when_it_changes_the_rate(self):
        out = self.run_case("schedule")
        refusal = self.refusals(out)[0]
        self.assertRegex(refusal,
                         r"^param_groups\[0\]'s learning rate changed from 0.1 to 0.01\d* \(an LR scheduler\?\)")
        self.assertIn("--set optimizer.schedule.kind=STEP", refusal)
        self.assertIn("[0] at step 3", out)

    def test_an_empty_parameter_is_left_out_and_a_scalar_trains(self):
        out = self.run_case("shapes")
        self.assertEqual(out.count("ok: "), 4, out)

    def test_two_models_under_the_same_names_are_refused_and_prefixed_names_train(self):
        out = self.run_case("two")
        first, second, third = self.refusals(out)
        self.assertRegex(first, r"^'[0-9]\.(weight|bias)' names another parameter already.*prefix=\"g\"")
        self.assertRegex(second, r"^broadcast_parameters: duplicate names 0.bias, 0.weight")
        self.assertRegex(third, r"^'d\.0\.weight' is not among the tensors defined on this worker.*for several "
                                r"optimizers over different parameters, define them all first")
        out = self.run_case("two-prefixed")
        self.assertEqual(out.count("ok: "), 2, out)

    def test_a_second_backward_before_step_names_the_way_out(self):
        first, second = self.refusals(self.run_case("again"))
        self.assertIn("to accumulate several backward() passes into one step, pass "
                      "DistributedOptimizer(backward_passes_per_step=N) (now 1)", first)
        self.assertIn("zero_grad() cannot take it back", second)
        self.assertIn("requires_grad_(False) on it for that backward()", second)

    def test_training_goes_on_after_an_exception_in_backward_and_step(self):
        out = self.run_case("raised", sets=["update_mode=SUM_ONLY"])
        self.assertIn("[0] caught: raised in backward", out)
        self.assert_matches_reference("raised")

    def test_add_param_group_takes_named_parameters_and_refuses_others(self):
        out = self.run_case("groups", sets=["update_mode=SUM_ONLY"])
        self.assertRegex(self.refusals(out)[0],
                         r"^add_param_group: 1 of the parameters \(shapes \(4,\)\) are not among")
        self.assertEqual(out.count("ok: "), 2, out)

    def test_param_groups_of_their_own_learning_rate_are_refused_on_the_servers_optimizer(self):
        out = self.run_case("groups")
        self.assertRegex(self.refusals(out)[0], r"^param_groups\[1\] has lr=0.1 and param_groups\[0\] 0.05, but in "
                                                r"update_mode on_server")

    def test_sum_only_resumes_adam_from_a_checkpoint_loaded_on_every_rank(self):
        with tempfile.TemporaryDirectory() as out:
            self.assertNotIn("warned", self.run_case("resume-1", sets=["update_mode=SUM_ONLY"], out=out))
            out = self.run_case("resume-2", sets=["update_mode=SUM_ONLY"], out=out)
        self.assertEqual(len(self.refusals(out)), 1, out)  # broadcast_optimizer_state, not load_state_dict
        self.assertIn("load the same state_dict on every rank (each reads the checkpoint) and leave this call out",
                      self.refusals(out)[0])
        self.assert_matches_reference("resume")

    def test_on_the_servers_adam_a_state_dict_warns_and_loading_one_is_refused(self):
        adam = ("optimizer.kind=ADAM", "optimizer.learning_rate=0.01")
        with tempfile.TemporaryDirectory() as out:
            self.assertIn("[0] warned: shardps.torch: the servers run ADAM, whose state is on them",
                          self.run_case("resume-1", servers_optimizer=adam, out=out))
            out = self.run_case("resume-2", servers_optimizer=adam, out=out)
        self.assertRegex(self.refusals(out)[0], "^load_state_dict: in update_mode on_server the servers run ADAM")

    def test_with_model_a_parameter_list_waits_in_its_parents_forward_and_a_weight_used_elsewhere_is_refused(self):
        out = self.run_case("parameter-list")
        self.assert_matches_reference("parameter-list")
        self.assertRegex(self.refusals(out)[0], r"^'skip.weight' was used by forward\(\) before its new weights landed")

    def test_with_model_a_model_zero_grad_after_step_leaves_the_gradients_on_the_wire_alone(self):
        self.run_case("model-zero", sets=["partition_bytes=4096"])
        self.assert_matches_reference("model-zero")

    def test_with_model_the_weights_land_before_the_models_own_forward_pre_hooks(self):
        out = self.run_case("hook-order")
        self.assertEqual(out.count("[0] ok: "), 4, out)

    def test_sparse_gradients_train_as_dense_ones(self):
        self.run_case("sparse")
        self.assert_matches_reference("sparse")


if __name__ == "__main__":
    unittest.main()
