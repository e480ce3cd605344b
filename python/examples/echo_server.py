#!/usr/bin/env python3
"""Echo server: registers NAME and echoes every SDU of every flow, one
thread per flow. Prints "ready" once registered and a line per request.

usage: echo_server.py NAME [DIF]
"""
import errno
import sys
import threading

import rina


def echo(flow):
    with flow:
        while True:
            sdu = flow.read()
            if not sdu:
                return
            flow.write(sdu)


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "echo"
    dif = sys.argv[2] if len(sys.argv) > 2 else None
    with rina.Control() as ctl:
        ctl.register(name, dif)
        print("ready", flush=True)
        while True:
            req = ctl.next_request()
            if req.remote.startswith("refuse"):
                req.refuse()
                print(f"refused {req.remote}", flush=True)
                continue
            try:
                flow = req.accept()
            except rina.RinaError as e:
                if e.errno != errno.EINVAL:
                    raise
                # Withdrawn meanwhile: the requester gave up, or the DIF's
                # accept timeout passed. (Control.accept() passes these over.)
                print(f"withdrawn {req.remote}", flush=True)
                continue
            s = req.spec
            print(
                f"accepted {req.remote} bw={s.avg_bandwidth} loss={s.max_loss} "
                f"gap={s.max_sdu_gap} in_order={s.in_order}",
                flush=True,
            )
            threading.Thread(target=echo, args=(flow,), daemon=True).start()


if __name__ == "__main__":
    main()
