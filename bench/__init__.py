"""Benchmarks: an emulated cluster of network namespaces with shaped links."""
