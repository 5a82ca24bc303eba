"""The local wing: one experiment, or a sweep's trials, on this machine with the server as a child process.

Independent of the Kubernetes wing (:mod:`servinglab.k8s`): both stand on the measurement driver and
the servers' seam.
"""
