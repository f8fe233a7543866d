"""The per-broker tierlog agent: hosts rlmm and rsm and serves them to the JVM plugin classes over gRPC.

`tierlog.agent.server.serve` is the entry point; `dev.demo` runs the end-to-end demo.
"""
