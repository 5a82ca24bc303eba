"""The cluster tests whose pods run as real containers, on the one real node they share.

Starting a real node costs minutes: most of it is importing the images (6.4 GB with PyPI's torch and its
CUDA libraries) into an empty containerd. So the node is started once for this package (`node` in its
conftest, package-scoped) and every module here runs its pods on it, each in a namespace of its own with
the chart installed there (`installed`, module-scoped). It is stopped when the package's last test ends.
"""
