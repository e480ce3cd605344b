#!/usr/bin/env python3
"""Echo server on asyncio: registers NAME and echoes every SDU of every
flow, one task per flow. Prints "ready" once registered.

usage: echo_server_async.py NAME [DIF]
"""
import asyncio
import sys

import rina


async def echo(flow):
    with flow:
        while sdu := await flow.read():
            await flow.write(sdu)


async def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "echo"
    dif = sys.argv[2] if len(sys.argv) > 2 else None
    tasks = set()
    with rina.Control() as ctl:
        await ctl.register_async(name, dif)
        print("ready", flush=True)
        while True:
            flow = await ctl.accept_async()
            print(f"accepted {flow.remote}", flush=True)
            t = asyncio.create_task(echo(flow))
            tasks.add(t)
            t.add_done_callback(tasks.discard)


if __name__ == "__main__":
    asyncio.run(main())
