"""``headcount calibrate``: measure the copy-bandwidth ceiling (GPU)."""

from __future__ import annotations

from headcount.common import env
from headcount.machine import calibrate
from headcount.reports import terminal
from headcount.store.dataset import check_output


def add_parser(subparsers):
    p = subparsers.add_parser("calibrate", help="measure the DRAM copy ceiling of this GPU (stored with a report)",
                              description="Time large device-to-device copies and report the fastest, 2 × bytes / time, "
                              "as the bandwidth ceiling the roofline uses instead of the datasheet's.")
    p.add_argument("-o", "--out", default=None, help="store it with this report (REPORT/calibration.json)")
    p.add_argument("--mib", type=int, default=2048, help="copy size in MiB (default 2048)")
    p.add_argument("--device", default="cuda", help=f"the GPU to measure: {env.CHOICES} (default cuda, the current GPU; "
                   "cpu: try the command without a GPU, no GPU ceiling)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    device = env.resolve(args.device)  # cuda without a GPU: one line, exit 3
    if args.out:
        check_output(args.out, append=True)
    result = calibrate.copy_ceiling(device, args.mib << 20)
    console = terminal.console()
    console.print(f"{result['device_name']}: copy ceiling {result['copy_ceiling_gbps']:,.1f} GB/s ({result['rule']})")
    if args.out:
        console.print(f"stored in {calibrate.save(result, args.out)}")
    return 0
