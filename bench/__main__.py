"""`make bench`: every function's benchmark, one after the other (`python -m bench [name ...]`)."""
import importlib
import sys

# irrelevant first: every function's irrelevant events, start-up and RSS next to the no-op, in one run;
# relevant: a relevant event's latency and API calls on the real control plane (bench/relevant.py); image:
# start-up and RSS from the container image (bench/image.py); broker: the real broker's latency beside localknative's.
ALL = ["irrelevant", "vmi_cleanup", "device_conflict", "migration_report", "io_pause_report", "alert_forwarder",
       "api_cost", "relevant", "image", "broker"]


def main(argv: list[str]) -> int:
    unknown = sorted(set(argv) - set(ALL))
    if unknown:
        print(f"no benchmark named {', '.join(unknown)}; there are: {', '.join(ALL)}", file=sys.stderr)
        return 2
    status = 0
    for name in argv or ALL:
        status |= importlib.import_module(f"bench.{name}").main([])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
