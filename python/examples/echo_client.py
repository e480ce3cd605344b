#!/usr/bin/env python3
"""Echo client: allocates a flow to NAME, sends COUNT SDUs and checks that
each comes back. With --async, does it on asyncio with three flows at once.

usage: echo_client.py [--async] NAME [COUNT]
"""
import asyncio
import sys
import time

import rina


def blocking(name, count):
    spec = rina.FlowSpec(max_delay_us=100_000)
    with rina.allocate(name, local="echo-client.py", spec=spec) as flow:
        for i in range(count):
            sdu = f"ping {i}".encode()
            t = time.monotonic()
            flow.write(sdu)
            assert flow.read(timeout=5) == sdu
            print(f"{len(sdu)} bytes back in {(time.monotonic() - t) * 1e3:.3f} ms")


async def one(name, n, count):
    flow = await rina.allocate_async(name, local=f"echo-client.py|{n}")
    with flow:
        for i in range(count):
            sdu = f"flow {n} ping {i}".encode()
            await flow.write(sdu)
            assert await asyncio.wait_for(flow.read(), 5) == sdu
    print(f"flow {n}: {count} SDUs echoed")


def main():
    args = sys.argv[1:]
    use_async = "--async" in args
    args = [a for a in args if a != "--async"]
    name = args[0] if args else "echo"
    count = int(args[1]) if len(args) > 1 else 3
    if use_async:
        async def all_flows():
            await asyncio.gather(*(one(name, n, count) for n in range(3)))

        asyncio.run(all_flows())
    else:
        blocking(name, count)


if __name__ == "__main__":
    main()
