"""The per-broker tierlog agent: hosts rlmm and rsm and serves them to the JVM plugin classes over gRPC.

`agent.server.serve` is the entry point; `agent.demo` runs the end-to-end demo.
"""
