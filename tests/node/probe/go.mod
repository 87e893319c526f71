// The in-pod test client of tests/node (stdlib only; built static, CGO_ENABLED=0).
module rlscale.dev/tests/node/probe

go 1.26.0
