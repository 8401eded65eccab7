"""Shipped test fakes: recording channels, an in-memory directory and audit sink, and more.

Each fake declares the zope interface it stands in for, and the test suite checks that with
``verifyObject``, so a fake cannot drift from the interface the real adapter implements.
"""
