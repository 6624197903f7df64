"""Where a worker finds its scheduler and rank: arguments first, then the environment of
the launcher it runs under. Only shardps.init() calls this; the library reads no environment.

Scheduler address: SHARDPS_SCHEDULER ("host:port"), else DMLC_PS_ROOT_URI + DMLC_PS_ROOT_PORT
(ps-lite, MXNet, BytePS launchers, Kubeflow MXJob).
Rank: SHARDPS_RANK, RANK (torchrun and most launchers), DMLC_WORKER_ID, SLURM_PROCID,
JOB_COMPLETION_INDEX (Kubernetes indexed Jobs), OMPI_COMM_WORLD_RANK, PMI_RANK.
Local rank: SHARDPS_LOCAL_RANK, LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, else 0.
Rendezvous timeout: SHARDPS_RENDEZVOUS_TIMEOUT (seconds > 0), else 60.
Security (a secured cluster): SHARDPS_SECURITY_CONFIG, the config file whose security { } block
the worker uses (shardps.init() reads it).
"""

import os

RANK_VARIABLES = ("SHARDPS_RANK", "RANK", "DMLC_WORKER_ID", "SLURM_PROCID", "JOB_COMPLETION_INDEX",
                  "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARIABLES = ("SHARDPS_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


def _first_int(names, env):
    for name in names:
        value = env.get(name)
        if value is None or value == "":
            continue
        try:
            number = int(value)
        except ValueError:
            raise ValueError("%s=%r is not an integer" % (name, value)) from None
        if number < 0:
            raise ValueError("%s=%d is negative" % (name, number))
        return number, name
    return None, None


def scheduler_address(explicit=None, env=None):
    """The scheduler's "host:port" and where it came from."""
    env = os.environ if env is None else env
    if explicit:
        return explicit, "argument"
    if env.get("SHARDPS_SCHEDULER"):
        return env["SHARDPS_SCHEDULER"], "SHARDPS_SCHEDULER"
    uri, port = env.get("DMLC_PS_ROOT_URI"), env.get("DMLC_PS_ROOT_PORT")
    if uri and port:
        return "%s:%s" % (uri, port), "DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT"
    raise ValueError("no scheduler address: pass scheduler='host:port' to shardps.init() or set "
                     "SHARDPS_SCHEDULER (or DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT); "
                     "`shardps launch` sets them")


def worker_rank(explicit=None, env=None):
    """This worker's rank and where it came from."""
    env = os.environ if env is None else env
    if explicit is not None:
        if explicit < 0:
            raise ValueError("rank %d is negative" % explicit)
        return int(explicit), "argument"
    rank, source = _first_int(RANK_VARIABLES, env)
    if rank is None:
        raise ValueError("no rank: pass rank=R to shardps.init() or set one of " + ", ".join(RANK_VARIABLES))
    return rank, source


def local_rank(env=None):
    """The worker's index among the workers on its machine (0 when nothing says)."""
    env = os.environ if env is None else env
    value, _ = _first_int(LOCAL_RANK_VARIABLES, env)
    return 0 if value is None else value


def rendezvous_timeout(explicit=None, env=None):
    """Seconds to wait for every node to register: the argument, else
    SHARDPS_RENDEZVOUS_TIMEOUT, else 60. ValueError unless a number > 0."""
    env = os.environ if env is None else env
    source, value = ("argument", explicit) if explicit is not None else \
        ("SHARDPS_RENDEZVOUS_TIMEOUT", env.get("SHARDPS_RENDEZVOUS_TIMEOUT", "60"))
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError("rendezvous timeout (%s) %r is not a number of seconds" % (source, value)) from None
    if not seconds > 0:
        raise ValueError("rendezvous timeout (%s) %r must be > 0 seconds" % (source, value))
    return seconds
