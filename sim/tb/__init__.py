"""Testbench support: payload layouts, cocotb stream helpers, job plumbing, network checks.

``layout`` and ``job`` import without cocotb; ``streams`` needs cocotb (simulator side only).
"""
