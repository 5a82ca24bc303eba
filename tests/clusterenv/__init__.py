"""Test clusters for the suite: a real Kubernetes control plane built from Go modules, run as local
processes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) with KWOK simulating
nodes — two Tesla-T4 GPU nodes and one CPU node — and pod lifecycles; or an existing cluster.

Used by tests/k8s/conftest.py; importable by later suites (operator, chart) the same way.
"""
