"""Development tooling run from the repository root; hack.cluster is the local Kubernetes cluster."""
