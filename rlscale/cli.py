"""The `rlscale` command line."""


def main() -> None:  # replaced by the real CLI below
    raise SystemExit("rlscale: CLI not built yet")
