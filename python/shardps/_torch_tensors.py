"""The tensors a DistributedOptimizer pushes (shardps.torch): their names, buffers and wire dtypes,
and the checks made once, as they are defined. Internal: shardps.torch is the interface."""

import inspect
import weakref

import torch

# id(parameter) -> (weakref to it, weakref to the DistributedOptimizer whose hooks it carries).
_owners = {}
# (id(worker), tensor name) -> (weakref to the parameter, weakref to the DistributedOptimizer
# that pushes it under that name).
_names = {}


def _owner(param):
    """The DistributedOptimizer whose hooks `param` carries, or None."""
    entry = _owners.get(id(param))
    return entry[1]() if entry is not None and entry[0]() is param else None


def _claim_names(worker, optimizer, named):
    """Records that `optimizer` pushes each of `named` under its name. Two models' parameters
    under one name (two nn.Sequential, each with a "0.weight") would be one tensor on the
    servers, both trained into it: refused while the earlier optimizer is open."""
    for name, param in named:
        entry = _names.get((id(worker), name))
        other = entry[0]() if entry is not None else None
        owner = entry[1]() if entry is not None else None
        # An optimizer whose construction failed has no _closed: it never pushed.
        if other is not None and other is not param and not getattr(owner, "_closed", True):
            raise ValueError("%r names another parameter already, one an earlier DistributedOptimizer still pushes: "
                             "the two would be one tensor on the servers. Give each model's parameters names of "
                             "their own (named_parameters=model.named_parameters(prefix=\"g\")), define them all "
                             "first with one broadcast_parameters() of every model's, or close() the earlier "
                             "optimizer if it is done" % name)
    for name, param in named:
        _names[(id(worker), name)] = (weakref.ref(param), weakref.ref(optimizer))


_HALF = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _zero_copy(p):
    return p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous()


def _device_path(p):
    return p.device.type == "cuda" and p.dtype == torch.float32 and p.is_contiguous()


def _wire_dtype(p, sum_only):
    """The dtype a parameter's tensor is defined with: its own for CPU 16-bit parameters
    (zero-copy), float32 otherwise."""
    if not sum_only and p.device.type == "cpu" and p.is_contiguous():
        return _HALF.get(p.dtype, "float32")
    return "float32"


class _Slot:
    """One parameter's transfer state."""

    def __init__(self, name, param, sum_only, priority):
        self.name, self.param, self.priority = name, param, priority
        self.shape = tuple(param.shape)  # as defined on the cluster: fixed for the job's life
        self.passes = 0
        self.handle = None
        self.hook = None  # registered once the parameter requires a gradient
        # (p.grad, its _version) when the push took it from p.grad: an in-place change after
        # that (clip_grad_norm_) would not reach the servers, and could race the library's read.
        self.sent = None
        self.dropped = False  # zero_grad() came after its push, before step()
        # The parameter's _version once the servers' weights were last in it (on_server): a
        # change made here since (p.clamp_, load_state_dict) would be overwritten by the next answer.
        self.landed_version = None
        self.deferred = False  # step() returned; the next forward waits for it
        # Frozen: the request of its last step's part in the round (skip_round), completed at
        # the next step, so its round trip overlaps that step's forward and backward.
        self.skip_handle = None
        self.on_device = not sum_only and _device_path(param)  # cleared if the library has no CUDA
        self.grad32 = self.weights32 = None
        # Pipelined: (handle, its (gradient, weights) buffer pair) of the requests of earlier
        # steps, oldest first, and the pairs they rotate through.
        self.inflight = []
        self.buffers = []
        self.turn = 0
        self.pair = None
        self.sum_only, self.depth, self.allocated = sum_only, 0, False
        if param.requires_grad:
            self.allocate()

    def allocate(self):
        """The staging buffers, made once the parameter is trainable: a frozen one (a frozen
        backbone) takes no memory until it is unfrozen."""
        self.allocated = True
        param = self.param
        if self.depth:
            self.buffers = [self.buffer_pair() for _ in range(self.depth + 1)]
        elif self.sum_only:
            self.weights32 = torch.zeros(param.shape, dtype=torch.float32)  # the mean gradient lands here
            if not _zero_copy(param):  # 16-bit or CUDA gradients go out through a float32 buffer
                self.grad32 = torch.zeros(param.shape, dtype=torch.float32)
        elif not (_zero_copy(param) or self.on_device or _wire_dtype(param, False) != "float32"):
            self.stage()

    def stage(self):
        self.grad32 = torch.zeros(self.param.shape, dtype=torch.float32)
        self.weights32 = torch.zeros(self.param.shape, dtype=torch.float32)

    def pipeline(self, depth):
        """Pipelined: depth + 1 (gradient, weights) buffer pairs of the wire dtype, one per
        request that may be in flight."""
        self.depth = depth
        self.grad32 = self.weights32 = None  # the pairs replace the staging buffers
        if self.allocated:
            self.buffers = [self.buffer_pair() for _ in range(depth + 1)]

    def next_pair(self):
        """The next pair of the rotation. One still held by a request in flight (there are
        more than depth of them after a step() that raised) is replaced, never shared."""
        pair = self.buffers[self.turn]
        if any(pair is held for _, held in self.inflight):
            pair = self.buffers[self.turn] = self.buffer_pair()
        self.turn = (self.turn + 1) % len(self.buffers)
        return pair

    def replace(self, pair):
        """A failed request (a timed-out one may still leave) keeps `pair`: the rotation
        gets a new one in its place."""
        for i, mine in enumerate(self.buffers):
            if mine is pair:
                self.buffers[i] = self.buffer_pair()

    def buffer_pair(self):
        dtype = self.param.dtype if _wire_dtype(self.param, False) != "float32" else torch.float32
        return torch.zeros(self.param.shape, dtype=dtype), torch.zeros(self.param.shape, dtype=dtype)


def _named(named_parameters, optimizer):
    if named_parameters is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return _nonempty([("param.%d" % i, p) for i, p in enumerate(params)])
    named = list(named_parameters)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("named_parameters has duplicate names: %s"
                         % ", ".join(sorted({n for n in names if names.count(n) > 1})))
    # One tensor under two names would be pushed twice a step, and the two answers would race
    # into its weights (model.named_parameters() lists a shared parameter once).
    first = {}
    for n, p in named:
        other = first.setdefault(id(p), n)
        if other != n:
            raise ValueError("named_parameters lists one parameter under two names: %r and %r" % (other, n))
    # A parameter the optimizer holds but named_parameters leaves out would get no hook: it would
    # never change (the servers' optimizer updates only what is pushed) or drift apart on each
    # worker, with no error.
    groups = optimizer.param_groups if optimizer is not None else []
    unnamed = ["param_groups[%d] #%d %s" % (g, i, tuple(p.shape))
               for g, group in enumerate(groups) for i, p in enumerate(group["params"])
               if p.requires_grad and id(p) not in first]
    if unnamed:
        listed = ", ".join(unnamed[:5]) + (", ..." if len(unnamed) > 5 else "")
        raise ValueError("named_parameters leaves out %d of the optimizer's parameters (%s): they would not be "
                         "trained through ShardPS; pass every one (model.named_parameters()) or give the "
                         "optimizer only those named" % (len(unnamed), listed))
    return _nonempty(named)


def _nonempty(named):
    """`named` without its tensors of no elements: there is nothing of them to train or send,
    and the cluster defines no tensor with a dimension of 0."""
    return [(n, t) for n, t in named if t.numel() > 0]


def _per_name(option, named, what):
    """{name: value} from a dict (names checked) or a callable(name, tensor)."""
    if option is None:
        return {}
    if callable(option):
        return {n: option(n, t) for n, t in named}
    unknown = sorted(set(option) - {n for n, _ in named})
    if unknown:
        raise KeyError("%s names parameters that are not among named_parameters: %s" % (what, ", ".join(unknown)))
    return dict(option)


def _define_or_check(worker, named, codecs=None, sum_only=False):
    codecs = codecs or {}
    # A 0-dim tensor (a scalar parameter, BatchNorm's num_batches_tracked) travels as one element:
    # the cluster defines no tensor without a dimension.
    specs = [(n, list(t.shape) or [1], _wire_dtype(t, sum_only), codecs.get(n) or None) for n, t in named]
    if not worker.tensors:
        worker.define(specs)
        return
    defined, dtypes = worker.tensors, worker.dtypes
    for n, shape, dtype, codec in specs:
        if n not in defined:
            raise KeyError("%r is not among the tensors defined on this worker, and none can be added once they are "
                           "defined (by the first DistributedOptimizer, from its named_parameters, or "
                           "broadcast_parameters): pass the same tensors to both (a state_dict() adds buffers, "
                           "e.g. BatchNorm's running statistics: broadcast model.named_parameters(), or the "
                           "state_dict before creating the DistributedOptimizer); for several optimizers over "
                           "different parameters, define them all first with one broadcast_parameters() of every "
                           "one's" % n)
        if shape != defined[n]:
            raise ValueError("%r has shape %s; it was defined with %s" % (n, shape, defined[n]))
        if codec:
            raise ValueError("%r: its codec cannot be set, the tensors are already defined on this worker "
                             "(create the DistributedOptimizer before broadcast_parameters)" % n)
        if dtype != dtypes[n]:
            raise ValueError("%r is %s; it was defined as %s" % (n, dtype, dtypes[n]))


def _refuse_compressed_momentum(config_field, codecs):
    """Sum-only jobs step the torch optimizer on each round's mean gradient. With Adam's
    variance frozen (optimizer.freeze_variance_after, part of the recipe a plain lossy codec
    with Adam gets) the compressed rounds instead carry each worker's Adam momentum, which only
    the library's own optimizer keeps: every push would fail at that round. Refused here, at
    once, rather than after freeze_variance_after steps. config_field: the worker's
    Worker.config_field (a config path to its value as text)."""
    freeze = int(config_field("optimizer.freeze_variance_after"))
    if freeze == 0 or config_field("optimizer.kind") != "ADAM":
        return
    specs = [config_field("compression.codec")]
    specs += [line.split("=", 1)[1] for line in config_field("compression.tensor_codecs").splitlines()]
    specs += [c for c in codecs.values() if c]
    if all(spec in ("", "none") for spec in specs):
        return
    raise ValueError(
        "the cluster freezes Adam's variance after %s rounds (optimizer.freeze_variance_after) and compresses "
        "gradients in update_mode sum_only, so its compressed rounds carry each worker's Adam momentum, which only "
        "the library's optimizer keeps; DistributedOptimizer steps the torch optimizer on mean gradients instead. "
        "Choose one: update_mode=UPDATE_ON_SERVER (the servers run the config's optimizer on the compressed "
        "gradients) or update_mode=SUM_ONLY set yourself (the torch optimizer steps on compressed mean gradients; "
        "no frozen variance), e.g. `shardps launch --set update_mode=UPDATE_ON_SERVER`" % freeze)


def _first_pre_hook(module, hook):
    """Registers `hook` as module's first forward pre-hook: one registered earlier may read the
    parameters (weight_norm computes weight from weight_g and weight_v in its own)."""
    try:
        return module.register_forward_pre_hook(hook, prepend=True)  # torch >= 2.0
    except TypeError:
        handle = module.register_forward_pre_hook(hook)
        module._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle


def _refuse_group_settings(param_groups):
    """In update_mode on_server the servers apply one optimizer, the cluster config's, to every
    tensor: param groups that differ (a lower learning rate for a backbone, no weight decay for
    biases) would be ignored, so they are refused."""
    first = param_groups[0]
    for i, group in enumerate(param_groups[1:], 1):
        for key in sorted((set(first) | set(group)) - {"params"}):
            if repr(first.get(key)) != repr(group.get(key)):
                raise ValueError("param_groups[%d] has %s=%r and param_groups[0] %r, but in update_mode on_server the "
                                 "servers apply the cluster config's optimizer to every tensor alike, so settings per "
                                 "group would be ignored: give every group the same settings, or use "
                                 "update_mode=SUM_ONLY, where the torch optimizer steps with its groups"
                                 % (i, key, group.get(key), first.get(key)))


def _refuse_closure_steps(optimizer):
    """In update_mode sum_only the torch optimizer steps once per step(), on the gradient the
    servers averaged. One whose step() needs its closure (LBFGS evaluates it several times a
    step, each a forward and backward) would push each evaluation's gradient as another step's:
    refused at once rather than at the second backward() or in torch's own TypeError."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise ValueError("%s.step() needs a closure it evaluates several times a step (a forward and backward "
                         "each), but in update_mode sum_only each backward() pushes its gradient for the servers "
                         "to average once per step: use an optimizer that steps on one gradient (SGD, Adam, ...), "
                         "or update_mode=UPDATE_ON_SERVER, where the servers' optimizer steps"
                         % type(optimizer).__name__)
