"""expect(): one misuse case of a worker script (errors_worker.py, misuse_worker.py). Prints
"ok: <case>: <error>" when `fn` raises `exception` and `check` accepts it; otherwise prints why
and exits 1."""

import sys


def expect(case, exception, fn, check=lambda e: True):
    try:
        fn()
    except exception as e:
        if not check(e):
            print("FAIL %s: %r" % (case, e))
            sys.exit(1)
        print("ok: %s: %s" % (case, e))
        return
    except Exception as e:
        print("FAIL %s: raised %r, expected %s" % (case, e, exception.__name__))
        sys.exit(1)
    print("FAIL %s: nothing raised, expected %s" % (case, exception.__name__))
    sys.exit(1)
