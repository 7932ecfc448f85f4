"""LinkCRC (the link's shared CRC-32) in Amaranth's simulator against ``zlib.crc32``."""

from __future__ import annotations

import random
import zlib

from amaranth.sim import Simulator
from pipetrain.hdl.link_crc import CRC_ALGORITHM, LinkCRC


def test_catalog_algorithm_is_zlib_crc32():
    params = CRC_ALGORITHM(data_width=8)
    assert params.compute(b"123456789") == 0xCBF43926 == zlib.crc32(b"123456789")
    rng = random.Random(1)
    for n in (0, 1, 7, 300):
        msg = bytes(rng.randrange(256) for _ in range(n))
        assert params.compute(msg) == zlib.crc32(msg)


def test_two_users_take_turns_bytes_with_gaps():
    """Each message is folded by one of the two ports with random idle cycles between bytes;
    its four read-out bytes equal zlib's CRC, little endian, whoever computed the one before."""
    dut = LinkCRC()
    rng = random.Random(5)
    msgs = [b"123456789", b"", b"\x00", b"\xff" * 5] + [
        bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))) for _ in range(20)
    ]
    got: list[bytes] = []

    async def bench(ctx):
        for k, msg in enumerate(msgs):
            port = (dut.rx, dut.tx)[rng.randrange(2) if k > 3 else k % 2]
            ctx.set(port.start, 1)
            await ctx.tick()
            ctx.set(port.start, 0)
            for b in msg:
                for _ in range(rng.choice((0, 0, 1, 3))):
                    await ctx.tick()
                ctx.set(port.data, b)
                ctx.set(port.valid, 1)
                await ctx.tick()
                ctx.set(port.valid, 0)
                ctx.set(port.data, rng.randrange(256))  # ignored without valid
            out = bytearray()
            for i in range(4):
                ctx.set(port.index, i)
                out.append(ctx.get(port.byte))
                assert ctx.get((dut.tx, dut.rx)[port is dut.tx].byte) == out[-1]
            ctx.set(port.index, 0)
            got.append(bytes(out))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got == [zlib.crc32(msg).to_bytes(4, "little") for msg in msgs]
