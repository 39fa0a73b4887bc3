"""Portable passes over the low-level IR: tracing, virtualization, cleanup, simplification and
routine-local storage. Every backend runs them (through `einjit.ir.optimize`)."""
