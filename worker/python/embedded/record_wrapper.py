import sys, os, runpy
def _ddprun_record(target, args):
    try:
        sys.argv = [target] + args
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")
    except Exception as e:
        import json, time, traceback
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            data = {"message": {"message": f"{type(e).__name__}: {e}",
                                "extraInfo": {"py_callstack": traceback.format_exc(),
                                              "timestamp": str(int(time.time()))}}}
            with open(path, "w") as fp:
                json.dump(data, fp)
        raise
_ddprun_record(sys.argv[2], sys.argv[3:])
