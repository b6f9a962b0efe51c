"""Reproductions of bugs in the libraries we use, written to be reported upstream, and the
tests that notice when a release fixes them."""
