"""PyTorch data parallelism through ShardPS.

    import shardps, shardps.torch
    shardps.init()
    opt = shardps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())
    shardps.torch.broadcast_parameters(model.named_parameters(), root_rank=0)
    for x, y in batches:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

Each parameter's gradient is pushed from a backward hook the moment autograd has
accumulated it, so communication overlaps the rest of backward; step() only waits for what
is still outstanding. The update is the cluster's: with the optimizer on the servers the
pulled weights are the update; in sum-only mode the worker library applies the cluster
config's optimizer to the averaged gradient in place. Either way the wrapped torch
optimizer's own step() is not called (its param_groups, zero_grad and state_dict are used
as they are), so the optimizer and learning rate are those of the cluster configuration.

CPU float32 contiguous parameters go zero-copy: the gradient is sent from p.grad and the
weights land in p.data. CUDA float32 contiguous parameters go through
shardps_push_pull_cuda: the library copies p.grad and p.data to pinned host memory on the
current CUDA stream and the new weights back into p.data on that stream, with no CPU tensor
in between (a library built without CUDA falls back to CPU copies). Other parameters
(float16, bfloat16, float64) are staged through float32 CPU copies.
"""

import itertools
import time

import torch

import shardps

_broadcasts = itertools.count()


def _zero_copy(p):
    return p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous()


def _device_path(p):
    return p.device.type == "cuda" and p.dtype == torch.float32 and p.is_contiguous()


class _Slot:
    """One parameter's transfer state."""

    def __init__(self, name, param):
        self.name, self.param = name, param
        self.passes = 0
        self.handle = None
        self.on_device = _device_path(param)  # cleared if the library has no CUDA
        if _zero_copy(param) or self.on_device:
            self.grad32 = self.weights32 = None
        else:
            self.grad32 = torch.zeros(param.shape, dtype=torch.float32)
            self.weights32 = torch.zeros(param.shape, dtype=torch.float32)


def _named(named_parameters, optimizer):
    if named_parameters is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return [("param.%d" % i, p) for i, p in enumerate(params)]
    named = list(named_parameters)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("named_parameters has duplicate names")
    return named


def _define_or_check(worker, named):
    if not worker.tensors:
        worker.define([(n, list(t.shape)) for n, t in named])
        return
    defined = worker.tensors
    for n, t in named:
        if n not in defined:
            raise KeyError("%r is not among the tensors defined on this worker" % n)
        if list(t.shape) != defined[n]:
            raise ValueError("%r has shape %s; it was defined with %s" % (n, list(t.shape), defined[n]))


class DistributedOptimizer:
    """Wraps a torch optimizer; see the module's description. Attributes not defined here
    (param_groups, state, ...) are the wrapped optimizer's.

    backward_passes_per_step: gradients of that many backward passes are accumulated
    locally (in p.grad, as torch does) before one push; call step() after each such group.
    timeout: seconds step() waits for each parameter (default: the worker's)."""

    def __init__(self, optimizer, named_parameters=None, backward_passes_per_step=1, worker=None, timeout=None):
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self.optimizer = optimizer
        self.worker = worker if worker is not None else shardps.worker()
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.timeout = timeout
        named = _named(named_parameters, optimizer)
        _define_or_check(self.worker, named)
        self._slots = [_Slot(n, p) for n, p in named if p.requires_grad]
        # Seconds step() has spent waiting for answers: what communication did not hide.
        self.wait_seconds = 0.0
        self._hooks = []
        for slot in self._slots:
            self._hooks.append(self._register(slot))

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

    def _on_gradient(self, slot):
        slot.passes += 1
        if slot.passes < self.backward_passes_per_step:
            return
        if slot.handle is not None:
            raise RuntimeError("the gradient of %r was produced again before step() (backward_passes_per_step=%d)"
                               % (slot.name, self.backward_passes_per_step))
        self._push(slot)

    def _push(self, slot):
        p = slot.param
        grad = p.grad
        if grad is None:
            grad = torch.zeros_like(p.data)
        if slot.on_device:
            grad = grad.contiguous()
            stream = torch.cuda.current_stream(p.device).cuda_stream
            try:
                slot.handle = self.worker.push_pull_cuda(slot.name, grad, p.data, stream)
                return
            except shardps.UnimplementedError:
                slot.on_device = False  # no CUDA in the library: stage through the CPU from now on
                slot.grad32 = torch.zeros(p.shape, dtype=torch.float32)
                slot.weights32 = torch.zeros(p.shape, dtype=torch.float32)
        if slot.grad32 is None:
            if not _zero_copy(grad):
                grad = grad.float().contiguous()
            slot.handle = self.worker.push_pull(slot.name, grad, p.data)
        else:
            slot.grad32.copy_(grad)
            slot.weights32.copy_(p.data)  # sum-only and delta pulls update the weights in place
            slot.handle = self.worker.push_pull(slot.name, slot.grad32, slot.weights32)

    def step(self, closure=None):
        """Waits for every parameter's new weights (pushing those whose gradient was not
        produced by a hook, e.g. unused parameters, with p.grad or zeros) and writes them
        into the parameters. Returns the closure's loss if a closure is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for slot in self._slots:
            if slot.handle is None:
                self._push(slot)
        start = time.perf_counter()
        try:
            for slot in self._slots:
                slot.handle.wait(self.timeout)
                if slot.weights32 is not None:
                    with torch.no_grad():
                        slot.param.copy_(slot.weights32)
        finally:
            self.wait_seconds += time.perf_counter() - start
            for slot in self._slots:
                slot.handle = None
                slot.passes = 0
        return loss

    def synchronize(self):
        """Same as step() without a closure (Horovod's name)."""
        self.step()

    def zero_grad(self, set_to_none=False):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state)

    def __getattr__(self, name):
        optimizer = self.__dict__.get("optimizer")
        if optimizer is None:
            raise AttributeError(name)
        return getattr(optimizer, name)


def broadcast_parameters(params, root_rank=0, worker=None, timeout=None):
    """Makes every worker's tensors equal to root_rank's: the root writes them to the
    servers as initial weights and every worker pulls them. `params` is a dict (e.g.
    model.state_dict()) or (name, tensor) pairs (model.named_parameters()); the tensors are
    defined on the worker if nothing is defined yet. Call before training: the servers take
    initial weights only before the first update."""
    worker = worker if worker is not None else shardps.worker()
    named = list(params.items()) if isinstance(params, dict) else list(params)
    _define_or_check(worker, named)
    if worker.rank == root_rank:
        for name, tensor in named:
            worker.init_tensor(name, tensor.detach().to("cpu", torch.float32).contiguous(), timeout)
    worker.barrier("shardps.torch.broadcast_parameters.%d" % next(_broadcasts))
    for name, tensor in named:
        if _zero_copy(tensor):
            worker.wait(worker.pull(name, tensor.data), timeout)
        else:
            staged = torch.zeros(tensor.shape, dtype=torch.float32)
            worker.wait(worker.pull(name, staged), timeout)
            with torch.no_grad():
                tensor.copy_(staged)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """The optimizer state that matters lives where updates are applied (the servers, or the
    worker library in sum-only mode), starts equal on every worker and is never in the
    torch optimizer: nothing to send. Resuming a torch optimizer's saved state into a
    cluster is not supported, and a non-empty state is refused rather than ignored."""
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    if any(len(s) for s in inner.state.values()):
        raise NotImplementedError("the optimizer has local state; ShardPS applies updates with the cluster's "
                                  "optimizer, whose state starts fresh on the servers, so loading local state "
                                  "into it is not supported")
    del root_rank  # every worker already agrees
