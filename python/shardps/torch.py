"""PyTorch data parallelism through ShardPS.

    import shardps, shardps.torch
    shardps.init()
    opt = shardps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())
    shardps.torch.broadcast_parameters(model.named_parameters(), root_rank=0)
    for x, y in batches:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

Each parameter's gradient is pushed from a backward hook the moment autograd has
accumulated it, so communication overlaps the rest of backward (explicit `priorities` hold a
gradient back until those ranked above it are pushed). step() completes the outstanding
requests in the order they finish (Worker.wait_any). Given `model=`, step() in update mode
on_server does not wait at all: a forward pre-hook of each module waits for its own
parameters, so the next forward gets the first layer's weights first and computes with them
while later layers' are still on the way (synchronize() waits for all, e.g. before saving).

Pipelining (async and ssp): the staleness these modes allow is used to hide the whole round
trip. step() returns once the answers of the step `pipeline` steps back have landed, so a step's
push, the servers' update and the pull overlap the next step's forward and backward, and each
forward computes with weights at most `pipeline` of this worker's steps old (plus what the
consistency mode allows between workers). On by default (1 step) in update mode on_server when
the cluster is async, or ssp with staleness >= 1; pipeline=0 turns it off, and sync refuses it
(each BSP step needs the previous one's weights). Each in-flight request has its own gradient and
weights buffers (a copy each way per step), so the parameters only change inside step().

Where the update happens is the cluster's update_mode:
- on_server: the servers run the cluster config's optimizer; the pulled weights are the
  update and the wrapped torch optimizer's step() is not called (its param_groups,
  zero_grad and state_dict are used as they are; a learning rate changed on it, by an LR
  scheduler, is refused at step(), and so is load_state_dict() where the servers' optimizer
  keeps momenta no state_dict holds).
- sum_only: the servers return the gradient averaged over the workers; it is written into
  p.grad and the wrapped torch optimizer steps (its kind and learning rate; the config's
  optimizer is not used).

Buffers: CPU contiguous float32, float16 and bfloat16 parameters go zero-copy: the gradient
is sent from p.grad and the weights land in p.data (16-bit ones are converted by the
library). CUDA float32 contiguous parameters go through shardps_push_pull_cuda: the library
copies p.grad and p.data to pinned host memory on the current CUDA stream and the new
weights back into p.data on that stream, with no CPU tensor in between (a library built
without CUDA falls back to CPU copies). Other parameters (float64, CUDA 16-bit) and every
sum-only gradient travel through float32 CPU copies.

Per-tensor compression: `compression` maps a parameter name to a codec spec of the cluster
config's kind ("fp16", "onebit", "topk:ratio=0.01", ...; None or "": the config's), as a dict
or a callable(name, parameter); the tensors are declared with it, and a codec the cluster
cannot use raises InvalidArgumentError naming the parameter.
"""

import itertools
import time
import warnings
import weakref

import torch

import shardps
# _named, _refuse_closure_steps and _refuse_compressed_momentum: the tests' too.
from shardps._torch_tensors import (_Slot, _claim_names, _define_or_check, _first_pre_hook, _named, _nonempty, _owner,
                                    _owners, _per_name, _refuse_closure_steps, _refuse_compressed_momentum,
                                    _refuse_group_settings, _zero_copy)

_broadcasts = itertools.count()


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer; see the module's description. Attributes not defined here
    (param_groups, state, ...) are the wrapped optimizer's. An instance of torch.optim.Optimizer,
    so LR schedulers take it (in update_mode on_server the servers' optimizer has its own
    learning rate and schedule, and a changed one is refused at step()); Optimizer.__init__
    is not run, its state is the wrapped optimizer's.

    backward_passes_per_step: gradients of that many backward passes are accumulated
    locally (in p.grad, as torch does) before one push; call step() after each such group.
    timeout: seconds step() waits for each answer (default: the worker's).
    compression: per-parameter codec specs (dict or callable(name, parameter)).
    priorities: per-parameter push priorities (dict or callable; higher goes first): a
    gradient is pushed once every parameter of a higher priority has been pushed this step.
    None: as backward produces them.
    model: the module the parameters belong to: its forward pre-hooks wait for each layer's
    new weights, so step() need not (update mode on_server only, when not pipelined).
    pipeline: how many steps a request may stay in flight behind step() (async and ssp;
    None: 1 where the cluster allows it, else 0). See the module's description."""

    param_groups = property(lambda self: self.optimizer.param_groups)
    state = property(lambda self: self.optimizer.state)
    defaults = property(lambda self: self.optimizer.defaults)

    def __init__(self, optimizer, named_parameters=None, backward_passes_per_step=1, worker=None, timeout=None,
                 compression=None, priorities=None, model=None, pipeline=None):
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self.optimizer = optimizer
        self.worker = worker if worker is not None else shardps.worker()
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.timeout = timeout
        self.sum_only = self.worker.update_mode == "sum_only"
        named = _named(named_parameters, optimizer)
        if self.sum_only:
            _refuse_closure_steps(optimizer)
        else:
            _refuse_group_settings(optimizer.param_groups)
        _claim_names(self.worker, self, named)
        codecs = _per_name(compression, named, "compression")
        if self.sum_only:
            _refuse_compressed_momentum(self.worker.config_field, codecs)
        _define_or_check(self.worker, named, codecs, self.sum_only)
        ranks = _per_name(priorities, named, "priorities")
        # Frozen parameters too: one unfrozen later (requires_grad_(True)) is pushed from then on.
        self._slots = [_Slot(n, p, self.sum_only, ranks.get(n, 0)) for n, p in named]
        # What the servers' optimizer cannot follow: a learning rate set later (an LR scheduler).
        self._learning_rates = [group.get("lr") for group in optimizer.param_groups]
        self._prioritised = bool(ranks)
        # Gradients produced but held back by a higher priority still to come (an ordered set).
        self._held = {}
        # Seconds spent waiting for answers (in step() and forward hooks): what communication
        # did not hide.
        self.wait_seconds = 0.0
        self.pipeline = self._pipeline_depth(pipeline)
        for slot in self._slots:
            if self.pipeline:
                slot.pipeline(self.pipeline)
        self._closed = False
        self._warned_state = self._warned_frozen = False
        # Whether frozen parameters take part in rounds without a gradient (Worker.skip_round);
        # False once the cluster refused it (no rounds: async), with why.
        self._skips, self._skip_refused = True, None
        self._take_over()
        self._hooks = []
        self._hook_trainable()
        for slot in self._slots:
            _owners[id(slot.param)] = (weakref.ref(slot.param), weakref.ref(self))
        self._defers = model is not None and not self.sum_only and not self.pipeline
        if self._defers:
            self._hooks += self._register_forward(model)

    def _take_over(self):
        """Closes the earlier DistributedOptimizers over any of these parameters: their hooks
        would push each gradient a second time. An optimizer made again (a new learning rate,
        after loading a checkpoint) is a common pattern, and the old one's hooks keep it alive
        even once its user dropped it."""
        earlier = []
        for slot in self._slots:
            owner = _owner(slot.param)
            if owner is not None and not owner._closed and all(owner is not e for e in earlier):
                earlier.append(owner)
        for owner in earlier:
            warnings.warn("shardps.torch: a new DistributedOptimizer takes over parameters of an earlier one "
                          "(%s...); the earlier one is closed (its hooks removed)" % owner._slots[0].name,
                          stacklevel=3)
            owner.close()

    def close(self):
        """Completes this optimizer's outstanding requests and removes its hooks: its parameters
        are no longer pushed by it, and step() raises. A new DistributedOptimizer over the same
        parameters closes the earlier one itself."""
        if self._closed:
            return
        try:
            self.synchronize()
        finally:
            self._closed = True
            for hook in self._hooks + [s.hook for s in self._slots if s.hook is not None]:
                (hook[0] if isinstance(hook, tuple) else hook).remove()
            self._hooks = []
            for slot in self._slots:
                slot.hook = None
            for slot in self._slots:
                if _owner(slot.param) is self:
                    del _owners[id(slot.param)]

    def _pipeline_depth(self, requested):
        """The pipeline depth: `requested`, checked against the cluster, or the default."""
        consistency = self.worker.consistency
        allows = consistency == "async" or (consistency == "ssp" and self.worker.staleness >= 1)
        on_cuda = [s.name for s in self._slots if s.on_device]
        if requested is None:
            return 1 if allows and not self.sum_only and not on_cuda else 0
        requested = int(requested)
        if requested < 0:
            raise ValueError("pipeline must be 0 or more, got %d" % requested)
        if requested == 0:
            return 0
        if not allows:
            raise ValueError("pipeline=%d needs consistency async, or ssp with staleness >= 1; the cluster is %s%s "
                             "(each sync step needs the previous step's weights)"
                             % (requested, consistency,
                                " with staleness 0" if consistency == "ssp" else ""))
        if self.sum_only:
            raise ValueError("pipeline=%d needs update_mode on_server: in sum_only the local optimizer steps "
                             "with each step's mean gradient" % requested)
        if on_cuda:
            raise ValueError("pipeline=%d takes CPU parameters; %s are on a CUDA device"
                             % (requested, ", ".join(on_cuda)))
        return requested

    def _hook_trainable(self):
        """Hooks the parameters that require a gradient and have no hook yet (frozen ones get
        theirs once unfrozen; until then step() pushes none of theirs)."""
        if self._closed:
            return
        for slot in self._slots:
            if slot.hook is None and slot.param.requires_grad:
                slot.hook = self._register(slot)

    def _register(self, slot):
        p = slot.param
        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            return p.register_post_accumulate_grad_hook(lambda _p, slot=slot: self._on_gradient(slot))
        # Older torch: a hook on the parameter's AccumulateGrad node runs once p.grad holds
        # the accumulated gradient. The node must be kept alive for the hook to stay.
        with torch.enable_grad():
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        handle = accumulator.register_hook(lambda *_, slot=slot: self._on_gradient(slot))
        return handle, accumulator

    def _register_forward(self, model):
        """A pre-hook per module with parameters of ours: it completes their requests, in
        the order forward uses them. A module that is never called (nn.ParameterList,
        nn.ParameterDict: its parent's forward uses the parameters) hands them to its parent."""
        by_param = {id(s.param): s for s in self._slots}
        parent_of = {id(child): module for module in model.modules() for child in module.children()}
        waits = {}  # id(module) -> (module, its slots)
        for module in model.modules():
            slots = [by_param[id(p)] for p in module.parameters(recurse=False) if id(p) in by_param]
            while type(module).forward is torch.nn.Module.forward and id(module) in parent_of:
                module = parent_of[id(module)]
            if slots:
                waits.setdefault(id(module), (module, []))[1].extend(slots)
        return [_first_pre_hook(module, lambda *_, slots=slots: self._complete(slots))
                for module, slots in waits.values()]

    def _on_gradient(self, slot):
        slot.passes += 1
        if slot.passes < self.backward_passes_per_step:
            return
        if slot.deferred:
            # A gradient means forward used the parameter, yet no pre-hook waited for its new weights:
            # forward computed with the old ones while the new ones were landing.
            raise RuntimeError("%r was used by forward() before its new weights landed: no forward pre-hook of the "
                               "DistributedOptimizer's model ran for it (a parameter used outside the forward of its "
                               "own module in `model`). Call synchronize() before such a forward, or leave model= out"
                               % slot.name)
        if slot.handle is not None or slot in self._held:
            raise RuntimeError(self._produced_again(slot))
        if not self._prioritised:
            self._push(slot)
            return
        self._held[slot] = None
        self._release(final=False)

    def _produced_again(self, slot):
        """Why a second gradient of `slot` before step() is refused, and what to do."""
        if slot.dropped:
            return ("the gradient of %r was produced again, and its gradient of an earlier backward() still waits for "
                    "step(): it was pushed as autograd produced it, and zero_grad() cannot take it back. Call step() "
                    "after each backward() whose gradients count, also after a backward() that raised (the "
                    "gradients it pushed are applied); a backward() whose gradients must not be applied (a GAN "
                    "generator's loss through the discriminator) must not reach the parameter: "
                    "requires_grad_(False) on it for that backward(), or detach()" % slot.name)
        return ("the gradient of %r was produced again before step(): each backward() pushes the gradients it "
                "produces; to accumulate several backward() passes into one step, pass "
                "DistributedOptimizer(backward_passes_per_step=N) (now %d)"
                % (slot.name, self.backward_passes_per_step))

    def _release(self, final):
        """Pushes the held gradients no higher priority still waits for (all when final)."""
        waiting = [s.priority for s in self._slots if s.handle is None and s not in self._held
                   and s.passes < self.backward_passes_per_step and s.param.requires_grad]
        bar = max(waiting) if waiting and not final else None
        ready = sorted((s for s in self._held if bar is None or s.priority >= bar), key=lambda s: -s.priority)
        for slot in ready:
            del self._held[slot]
            self._push(slot)

    def _push(self, slot):
        p = slot.param
        grad = p.grad
        slot.sent = (grad, grad._version) if grad is not None else None
        if not slot.allocated:
            slot.allocate()
        if grad is None:
            grad = torch.zeros_like(p.data)
        elif grad.is_sparse:  # nn.Embedding(sparse=True): the cluster's tensors are dense
            grad = grad.to_dense()
        if self.pipeline:
            # Its own buffers: the parameter and p.grad may change while it is in flight.
            slot.pair = slot.next_pair()  # step() files the request with it
            grad_buffer, weights_buffer = slot.pair
            grad_buffer.copy_(grad)
            slot.handle = self.worker.push_pull(slot.name, grad_buffer, weights_buffer)
            return
        if self.sum_only:
            if slot.grad32 is not None:
                slot.grad32.copy_(grad)
                grad = slot.grad32
            elif not _zero_copy(grad):
                grad = grad.detach().to("cpu", torch.float32).contiguous()
            slot.handle = self.worker.push_pull_mean_gradient(slot.name, grad, slot.weights32)
            return
        if slot.on_device:
            grad = grad.contiguous()
            stream = torch.cuda.current_stream(p.device).cuda_stream
            try:
                slot.handle = self.worker.push_pull_cuda(slot.name, grad, p.data, stream)
                return
            except shardps.UnimplementedError:
                slot.on_device = False  # no CUDA in the library: stage through the CPU from now on
                slot.stage()
        if slot.grad32 is None:
            if grad.dtype != p.dtype or not grad.is_contiguous():
                grad = grad.to(p.dtype).contiguous()
            slot.handle = self.worker.push_pull(slot.name, grad, p.data)
        else:
            slot.grad32.copy_(grad)
            slot.weights32.copy_(p.data)  # sum-only and delta pulls update the weights in place
            slot.handle = self.worker.push_pull(slot.name, slot.grad32, slot.weights32)

    def _land(self, slot):
        """After slot's request completed: its answer into the parameter."""
        slot.handle, slot.deferred, slot.dropped = None, False, False
        if self.sum_only:
            slot.sent = None  # p.grad becomes the mean gradient
            if slot.param.grad is None or slot.param.grad.is_sparse:
                slot.param.grad = torch.zeros_like(slot.param)
            slot.param.grad.copy_(slot.weights32)
        elif slot.grad32 is not None:
            with torch.no_grad():
                slot.param.copy_(slot.weights32)
            slot.landed_version = slot.param._version

    def _complete(self, slots):
        """Completes the outstanding requests of `slots` in the order they finish."""
        slot_of = {s.handle: s for s in slots if s.handle is not None}
        pending = self.worker.completions(slot_of)
        start = time.perf_counter()
        try:
            while pending:
                self._land(slot_of[pending.wait_any(self.timeout)])
        except shardps.ShardPSError as e:
            if e.handle is not None:
                slot = slot_of[e.handle]
                slot.handle, slot.deferred = None, False
                raise
            # None answered in time: release each (its error names the servers still owing).
            for handle in pending.handles:
                slot = slot_of[handle]
                slot.handle, slot.deferred = None, False
                try:
                    handle.wait(0)
                except shardps.ShardPSError as timed_out:
                    e = timed_out
            raise e
        finally:
            self.wait_seconds += time.perf_counter() - start

    def _catch_up(self, depth):
        """Pipelined: lands the in-flight requests until at most `depth` per parameter are
        left, then those already answered, oldest first, so each parameter holds the newest
        weights it can without waiting longer than it must."""
        start = time.perf_counter()
        try:
            for slot in self._slots:
                while slot.inflight:
                    handle, pair = slot.inflight[0]
                    if len(slot.inflight) > depth:
                        handle.wait(self.timeout)
                    elif not self.worker.poll(handle):
                        break
                    slot.inflight.pop(0)
                    with torch.no_grad():
                        slot.param.copy_(pair[1])
                    slot.landed_version = slot.param._version
        except shardps.ShardPSError:
            # The others stay in flight (this and later parameters may keep more than `depth`;
            # next_pair never hands out a pair one of them holds).
            slot.replace(slot.inflight.pop(0)[1])
            raise
        finally:
            self.wait_seconds += time.perf_counter() - start

    def step(self, closure=None):
        """Pushes what no hook pushed (unused parameters: p.grad or zeros) and completes every
        request, landing the new weights in the parameters (sum-only: the mean gradient in
        p.grad, then the wrapped optimizer steps). With `model` in update mode on_server it
        returns at once and the next forward completes them; p.grad is then None, as the
        gradients are still being sent from it. Returns the closure's loss."""
        if self._closed:
            raise RuntimeError("this DistributedOptimizer is closed (close(), or a newer one over the same "
                               "parameters took them over)")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_learning_rates()
        self._check_gradients_unchanged()
        self._check_weights_unchanged()
        self._reap_skips()
        self._hook_trainable()
        self._complete([s for s in self._slots if s.deferred])  # a step with no forward since
        self._release(final=True)
        for slot in self._slots:
            # Unused parameters (no gradient this step); not one synchronize() completed. A frozen
            # one pushes no zeros (the servers' optimizer, momentum, Adam or weight decay, would
            # move it): it takes its part in the round without a gradient.
            if slot.handle is None and slot.passes < self.backward_passes_per_step:
                if slot.param.requires_grad:
                    self._push(slot)
                else:
                    self._skip(slot)
        if self.pipeline:
            self._file()
            self._next_round()
            self._catch_up(self.pipeline)
            return loss
        if self._defers:
            for slot in self._slots:
                slot.deferred = slot.handle is not None  # not a frozen one
                if slot.deferred:
                    # The library still reads it: a model.zero_grad() (in place on older torch) must
                    # not reach it. The request keeps it alive.
                    slot.param.grad = None
            self._next_round()
            return loss
        try:
            self._complete(self._slots)
        finally:
            for slot in self._slots:
                slot.handle = None
            self._next_round()
        if self.sum_only:
            self.optimizer.step()
        return loss

    def _skip(self, slot):
        """A frozen parameter's part in the round: no gradient, so the round applies no step to
        it, and its partitions keep pace with the rest of the model's (sync checkpoints wait for
        every partition's round; a worker that rejoins starts every partition at one round).
        Where no round waits for it (async), it sends nothing."""
        if self._skips:
            try:
                slot.skip_handle = self.worker.skip_round(slot.name)
                return
            except shardps.FailedPreconditionError as e:
                self._skips, self._skip_refused = False, str(e)
        self._warn_frozen(slot)

    def _reap_skips(self):
        """Completes the frozen parameters' requests of the last step (their answers carry
        nothing; a failed one raises here, a step late)."""
        for slot in self._slots:
            handle, slot.skip_handle = slot.skip_handle, None
            if handle is not None:
                handle.wait(self.timeout)

    def _warn_frozen(self, slot):
        """A frozen tensor that cannot take part in rounds (the cluster refused skip_round)
        completes none, and a sync cluster writes a checkpoint's manifest once every partition
        has reached its round: warned once."""
        if self._warned_frozen or self.worker.consistency != "sync":
            return
        self._warned_frozen = True
        if self.worker.config_field("checkpoint.dir"):
            warnings.warn("shardps.torch: %r is frozen and cannot take part in rounds without a gradient (%s): its "
                          "partitions complete no rounds, and the cluster's checkpoints (checkpoint.dir) wait for "
                          "every partition to reach their round and will not complete while it stays frozen"
                          % (slot.name, self._skip_refused), stacklevel=3)

    def _next_round(self):
        for slot in self._slots:
            slot.passes, slot.sent, slot.dropped = 0, None, False
            if not self.sum_only and slot.landed_version is None:
                slot.landed_version = slot.param._version  # from the first step on

    def _check_weights_unchanged(self):
        """In update_mode on_server the weights are the servers': one changed in place here since
        their last answer (weight clipping, load_state_dict) would be overwritten by the next one,
        never reaching them. Seen through the parameter's version, which in-place changes under
        torch.no_grad() count (changes through p.data do not)."""
        for slot in self._slots:
            if slot.landed_version is not None and slot.param._version != slot.landed_version:
                raise RuntimeError(
                    "the weights of %r were changed on this worker since the servers' last answer (an in-place "
                    "change such as clamp_, or load_state_dict, after step()): in update_mode on_server the weights "
                    "are the servers', and the next answer would overwrite the change. Change weights before "
                    "broadcast_parameters(), or use update_mode=SUM_ONLY, where the torch optimizer steps the "
                    "workers' own weights" % slot.name)

    def _check_learning_rates(self):
        """On the servers' optimizer, a learning rate set on the torch optimizer (an LR scheduler)
        would have no effect: refused when it changes rather than ignored."""
        if self.sum_only:
            return
        for i, (group, was) in enumerate(zip(self.optimizer.param_groups, self._learning_rates)):
            if group.get("lr") != was:
                raise RuntimeError(
                    "param_groups[%d]'s learning rate changed from %s to %s (an LR scheduler?), but in update_mode "
                    "on_server the servers apply the cluster config's optimizer.learning_rate (%s) and "
                    "optimizer.schedule, not the torch optimizer's: the change would have no effect. Schedule on the "
                    "servers (--set optimizer.schedule.kind=STEP, optimizer.schedule.step_size, "
                    "optimizer.schedule.gamma; or COSINE), or use update_mode=SUM_ONLY, where the torch optimizer "
                    "and its scheduler step" % (i, was, group.get("lr"),
                                                self.worker.config_field("optimizer.learning_rate")))

    def _check_gradients_unchanged(self):
        """A gradient changed in place after backward() pushed it (clip_grad_norm_, a scaler's
        unscale_) reaches no one: the servers took it as it was, and may still be reading it."""
        for slot in self._slots:
            if slot.sent is None:
                continue
            grad, version = slot.sent
            if slot.param.grad is grad and grad._version != version:
                where = ("the servers average it as it was pushed; call synchronize() after backward(): the averaged "
                         "gradient lands in p.grad, change that, then step()" if self.sum_only else
                         "the servers apply it as it was pushed, so the change would be lost; to clip or scale the "
                         "gradient use update_mode=SUM_ONLY and call synchronize() after backward(): the averaged "
                         "gradient lands in p.grad, clip that, then step()")
                raise RuntimeError("the gradient of %r changed after backward() pushed it (clip_grad_norm_, "
                                   "unscale_ or another in-place change before step()): %s" % (slot.name, where))

    @property
    def outstanding(self):
        """Names of the parameters whose requests are still on the wire."""
        return [s.name for s in self._slots if s.handle is not None or s.inflight or s.skip_handle is not None]

    def _file(self):
        """Pipelined: this step's requests join their parameters' in-flight lists."""
        for slot in self._slots:
            if slot.handle is not None:
                slot.inflight.append((slot.handle, slot.pair))
                slot.handle = None

    def synchronize(self):
        """Completes every outstanding request (after step() with `model`, or pipelined:
        before reading or saving the weights outside a forward). In update_mode sum_only,
        between backward() and step() it lands the averaged gradients in p.grad, where they may
        be changed (clip_grad_norm_) before step() steps the torch optimizer with them."""
        self._check_gradients_unchanged()
        self._reap_skips()
        if self.pipeline:
            self._file()
            self._catch_up(0)
            return
        self._complete([s for s in self._slots if s.handle is not None])

    def zero_grad(self, set_to_none=None):
        """The wrapped optimizer's zero_grad (set_to_none: its default when None)."""
        # A gradient still on the wire must not be zeroed in place (the library sends it
        # from p.grad without a copy, and may send it again after a fail-over): drop it
        # instead; its request keeps it alive. That includes one a backward hook pushed before
        # this zero_grad(): it was sent, and the next step() applies it.
        for slot in self._slots:
            # Before backward, which would fail inside autograd with no word of why on older torch
            # (the hook keeps the parameter's gradient accumulator, which holds the old shape).
            if tuple(slot.param.shape) != slot.shape:
                raise ValueError("%r has shape %s; it was defined on the cluster with %s, and a tensor's shape "
                                 "cannot change in a job (start the job again with the new model)"
                                 % (slot.name, tuple(slot.param.shape), slot.shape))
            if slot.deferred or slot.handle is not None:
                slot.param.grad = None
                slot.dropped = slot.handle is not None
        self._hook_trainable()
        if set_to_none is None:
            self.optimizer.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def _servers_state(self):
        """The kind of the servers' optimizer when it keeps state per weight (momenta) that no
        torch state_dict holds, else None."""
        if self.sum_only:
            return None
        kind = self.worker.config_field("optimizer.kind")
        return kind if kind in ("MOMENTUM", "ADAM", "ADAGRAD") else None

    def state_dict(self):
        """The wrapped optimizer's state_dict: in update_mode on_server it holds no momenta, which
        live on the servers (warned once)."""
        kind = self._servers_state()
        if kind and not self._warned_state:
            self._warned_state = True
            warnings.warn("shardps.torch: the servers run %s, whose state is on them: state_dict() holds only the "
                          "torch optimizer's param_groups, and a job resumed from it starts %s afresh" % (kind, kind),
                          stacklevel=2)
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        """The wrapped optimizer's load_state_dict; refused in update_mode on_server with a
        servers' optimizer that keeps state, which a resumed job could not get back."""
        kind = self._servers_state()
        if kind:
            raise NotImplementedError(
                "load_state_dict: in update_mode on_server the servers run %s, whose state (momenta) is on them and in "
                "no torch state_dict, so a job resumed from a checkpoint would start it afresh while looking resumed. "
                "Leave load_state_dict out to accept that, or train in update_mode=SUM_ONLY, where the torch "
                "optimizer's state_dict is the whole state (load it on every rank)" % kind)
        self.optimizer.load_state_dict(state)

    def add_param_group(self, param_group):
        """The wrapped optimizer's add_param_group, for parameters among named_parameters (a new
        learning rate for some of them, or ones unfrozen later): no tensor can be added to the
        cluster once they are defined, and a parameter not pushed would train on this worker's
        gradients alone (sum_only) or not at all."""
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        ours = {id(s.param) for s in self._slots}
        missing = [tuple(p.shape) for p in params if id(p) not in ours and p.numel() > 0]
        if missing:
            raise ValueError("add_param_group: %d of the parameters (shapes %s) are not among this "
                             "DistributedOptimizer's named_parameters, and no tensor can be added to the cluster "
                             "once they are defined: pass every parameter to be trained in named_parameters when "
                             "creating it (a frozen one may be among them, and unfrozen later)"
                             % (len(missing), ", ".join(str(m) for m in missing[:5])))
        self.optimizer.add_param_group(param_group)
        if not self.sum_only:
            try:
                _refuse_group_settings(self.optimizer.param_groups)
            except ValueError:
                self.optimizer.param_groups.pop()
                raise
        self._learning_rates.append(self.optimizer.param_groups[-1].get("lr"))

    def __repr__(self):
        return "DistributedOptimizer(%r)" % (self.optimizer,)

    def __getattr__(self, name):
        optimizer = self.__dict__.get("optimizer")
        if optimizer is None:
            raise AttributeError(name)
        return getattr(optimizer, name)


def broadcast_parameters(params, root_rank=0, worker=None, timeout=None):
    """Makes every worker's tensors equal to root_rank's: the root writes them to the
    servers as initial weights and every worker pulls them. `params` is a dict (e.g.
    model.state_dict()) or (name, tensor) pairs (model.named_parameters()); the tensors are
    defined on the worker if nothing is defined yet (so a state_dict with buffers goes before the
    DistributedOptimizer, which defines its named_parameters). Call before training: the servers
    take initial weights only before the first update. A worker that rejoined a running job
    (`Worker.rejoin_round`) only pulls the current weights in the calls the job made before it
    came back (those whose barrier the job passed: `Worker.passed_before_rejoin`): its own fresh
    weights must not replace the trained ones, and the others will not enter that barrier again.
    Its later calls meet the other ranks at the barrier like anyone's."""
    worker = worker if worker is not None else shardps.worker()
    named = list(params.items()) if isinstance(params, dict) else list(params)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):  # two models' "0.weight": one would overwrite the other
        raise ValueError("broadcast_parameters: duplicate names %s; give each model's tensors names of their own "
                         "(model.named_parameters(prefix=\"g\"))"
                         % ", ".join(sorted({n for n in names if names.count(n) > 1})))
    named = _nonempty(named)
    _define_or_check(worker, named, sum_only=worker.update_mode == "sum_only")
    # Numbered in call order, on every rank alike: a rejoined process counts the calls it skips.
    barrier = "shardps.torch.broadcast_parameters.%d" % next(_broadcasts)
    if not worker.passed_before_rejoin(barrier):
        if worker.rank == root_rank:
            for name, tensor in named:
                worker.init_tensor(name, tensor.detach().to("cpu", torch.float32).contiguous(), timeout)
        worker.barrier(barrier)
    for name, tensor in named:
        if _zero_copy(tensor):
            worker.wait(worker.pull(name, tensor.data), timeout)
        else:
            staged = torch.zeros(tensor.shape, dtype=torch.float32)
            worker.wait(worker.pull(name, staged), timeout)
            with torch.no_grad():
                tensor.copy_(staged)


def broadcast_optimizer_state(optimizer, root_rank=0, worker=None):
    """The optimizer state that matters lives where updates are applied: on the servers
    (update mode on_server), or in the wrapped torch optimizer (sum_only), where it starts
    empty on every worker and every worker steps on the same averaged gradient, so it stays
    equal: nothing to send. A non-empty state cannot be sent (the cluster's tensors are fixed
    once defined), and is refused rather than ignored: in sum_only a checkpoint's state is
    loaded on every rank instead."""
    del root_rank  # nothing is sent
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    if not any(len(s) for s in inner.state.values()):
        return
    worker = worker if worker is not None else shardps.worker()
    if worker.update_mode == "sum_only":
        raise NotImplementedError("the torch optimizer has state (a loaded checkpoint?), which "
                                  "broadcast_optimizer_state cannot send: the cluster's tensors are fixed once "
                                  "defined. Each worker steps its own torch optimizer in update_mode sum_only, so "
                                  "load the same state_dict on every rank (each reads the checkpoint) and leave this "
                                  "call out")
    raise NotImplementedError("the optimizer has local state; ShardPS applies updates with the cluster's "
                              "optimizer, whose state starts fresh on the servers, so loading local state "
                              "into it is not supported")
