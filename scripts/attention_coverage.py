"""Which transformers model families headcount tags, tried one by one (issue 16).

For every model type of the installed transformers with a causal-LM or
masked-LM head, build the model from its default config shrunk to a few
layers and heads (random weights), run one forward + backward untagged, then
under ``AttentionTagger`` in layer mode and in head mode, and say per family:

- ``interface`` / ``hooks``: every layer tagged, in both phases, through
  transformers' attention interface or through module hooks; outputs and
  gradients compared with the untagged step (``exact`` or ``differs``), once
  two untagged steps are seen to agree (else ``not deterministic``: the
  family's own numbers move from run to run, so no comparison says anything);
  and whether the ranges nest (no layer's range inside another's, every
  head's inside its layer's: ``nested``);
- ``no tags``: the step ran but no attention call was tagged;
- ``refused``: head mode said in one line, before the step, that it cannot
  split this model; ``split failed``: the split failed inside the step with
  one ``HeadcountError`` naming what the call uses (clean for the user, but a
  family head mode should learn);
- ``FAILED``: headcount made the user's step fail (a bug);
- ``not buildable``: the family does not build or run from a shrunk default
  config on this CPU (not headcount's doing).

Run: python scripts/attention_coverage.py [--only llama,bloom,…] [--json out.json]
Each family runs in a process of its own, under a memory limit (``--memory-gib``,
default 4) and a time limit (``--timeout``, default 300 s): a family whose
default config stays huge once shrunk is "not buildable", never the end of
the sweep. The tests run a fixed subset in-process (tests/test_attention_coverage.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, field

import torch

SMALL = {  # attribute spellings across families → the small value
    ("hidden_size", "d_model", "n_embd", "dim", "embed_dim"): 64,
    ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "decoder_layers"): 2,
    ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads"): 4,
    ("num_key_value_heads", "num_kv_heads"): 2,
    ("intermediate_size", "ffn_dim", "d_ff", "n_inner", "decoder_ffn_dim", "hidden_dim"): 128,
    ("head_dim", "d_kv", "attention_head_size"): 16,
    ("max_position_embeddings", "n_positions", "max_seq_len"): 64,
}


@dataclass
class Outcome:
    family: str
    layer: str = ""          # interface | hooks | no tags | FAILED | not buildable
    head: str = ""           # exact | differs | not deterministic | refused | split failed | no tags | FAILED | –
    layer_exact: bool | None = None
    detail: str = ""
    phases: list = field(default_factory=list)
    deterministic: bool | None = None
    nested: bool | None = None


class _Recorder:
    """Stands in for the tagger's range emitter (no NVTX, no profiler):
    keeps the ranges as they are opened, with the ranges around them."""

    def __init__(self):
        self.stack: list[str] = []
        self.opened: list[tuple[str, ...]] = []  # each range with the ranges around it, outermost first

    def push(self, name: str):
        self.opened.append((*self.stack, name))
        self.stack.append(name)

    def pop(self, token=None) -> None:
        self.stack.pop()

    def push2(self, outer: str, inner: str):
        self.push(outer)
        self.push(inner)

    def pop2(self, tokens=None) -> None:
        self.pop()
        self.pop()


def ranges_nested(recorder: _Recorder) -> bool:
    """Every range sits where the naming scheme puts it: a phase
    (``fwd``/``bwd``/``recompute``) outermost, its layer inside it, a head
    inside its layer, nothing deeper (a backward range closed late shows up
    as a phase inside another layer's range); and every range closed."""
    for path in recorder.opened:
        if path[0] not in ("fwd", "bwd", "recompute") or len(path) > 3 or any(p in ("fwd", "bwd", "recompute") for p in path[1:]):
            return False
        if len(path) == 3 and not path[2].startswith("head."):
            return False
    return not recorder.stack


def _families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_MASKED_LM_MAPPING_NAMES))


def _build(family: str):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.for_model(family)
    for names, value in SMALL.items():
        for name in names:
            if isinstance(getattr(config, name, None), int) and not isinstance(getattr(config, name), bool):
                try:
                    setattr(config, name, value)
                except AttributeError:  # a derived property (Falcon's head_dim)
                    pass
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "dropout", "resid_pdrop",
                 "embd_pdrop", "attn_pdrop", "hidden_dropout", "activation_dropout"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
    config._attn_implementation = "eager"
    auto = AutoModelForCausalLM if family in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModelForMaskedLM
    torch.manual_seed(0)
    return auto.from_config(config).eval()


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().clone(), grads


def _same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def _tagged_step(model, ids, mode: str):
    """One training step under ``AttentionTagger`` in ``mode``: ``(tagger, step's
    logits and gradients, whether its ranges nested)``."""
    from headcount import AttentionTagger

    tagger = AttentionTagger([model], mode=mode)
    tagger.emitter = recorder = _Recorder()
    with tagger:
        result = _step(model, ids)
    return tagger, result, ranges_nested(recorder)


def try_family(family: str) -> Outcome:
    """One family's outcome (never raises)."""
    from headcount.common.errors import HeadcountError

    result = Outcome(family)
    ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = _build(family)
            reference = _step(model, ids)
            result.deterministic = _same(reference, _step(model, ids))
    except Exception as exc:  # noqa: BLE001 - any failure here is the family's, not headcount's
        result.layer, result.head, result.detail = "not buildable", "–", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return result
    layers = None
    try:
        tagger, tagged, result.nested = _tagged_step(model, ids, "layer")
        phases = {c.phase for c in tagger.calls}
        layers = {c.layer_name for c in tagger.calls}
        result.phases = sorted(phases)
        if not tagger.calls:
            result.layer = "no tags"
        else:
            result.layer = "hooks" if "module hooks" in tagger.paths.values() else "interface"
        result.layer_exact = _same(reference, tagged) if result.deterministic else None
    except Exception as exc:  # noqa: BLE001 - recorded as a headcount failure
        result.layer, result.detail = "FAILED", f"layer mode: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return result
    try:
        tagger, split, nested = _tagged_step(model, ids, "head")
        result.nested = result.nested and nested
        if not tagger.calls:
            result.head = "no tags"
        elif not result.deterministic:
            result.head = "not deterministic"
        else:
            result.head = "exact" if _same(reference, split) else "differs"
            heads = {c.layer_name for c in tagger.calls if c.head is not None}
            if layers and heads != layers:
                result.detail = f"head mode split {len(heads)} of {len(layers)} layers"
    except HeadcountError as exc:  # refused up front, or a failure inside the split said in one line (still a bug)
        failed = "head mode could not compute" in exc.one_line()
        result.head, result.detail = "split failed" if failed else "refused", exc.one_line()[:200]
    except Exception as exc:  # noqa: BLE001 - recorded as a headcount failure
        result.head, result.detail = "FAILED", f"head mode: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return result


def _isolated(family: str, memory_gib: float, timeout: float) -> Outcome:
    """:func:`try_family` in a child process under the memory and time limits."""
    limit = int(memory_gib * 2**30)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        done = subprocess.run([sys.executable, __file__, "--one", family], capture_output=True, text=True, timeout=timeout,
                              preexec_fn=cap)
    except subprocess.TimeoutExpired:
        return Outcome(family, "not buildable", "–", None, f"ran past {timeout:.0f} s")
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not last.startswith("{"):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return Outcome(family, "not buildable", "–", None, f"its process ended with status {done.returncode} ({tail}); "
                       f"limit {memory_gib:g} GiB")
    return Outcome(**json.loads(last))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=None, help="comma-separated model types (default: every causal/masked LM family)")
    p.add_argument("--json", default=None, help="also write the outcomes as JSON")
    p.add_argument("--memory-gib", type=float, default=4.0, help="address-space limit per family (default 4 GiB)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per family (default 300)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child: one family, its outcome as JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(asdict(try_family(args.one))))
        return 0
    families = args.only.split(",") if args.only else _families()
    outcomes = []
    for family in families:
        outcome = _isolated(family, args.memory_gib, args.timeout)
        outcomes.append(outcome)
        print(f"{family:28s} layer: {outcome.layer:13s} exact: {str(outcome.layer_exact):5s} head: {outcome.head:8s} "
              f"nested: {str(outcome.nested):5s} {outcome.detail}", flush=True)
    built = [o for o in outcomes if o.layer != "not buildable"]
    tagged = [o for o in built if o.layer in ("interface", "hooks")]
    print(f"\n{len(families)} families, {len(built)} buildable from a shrunk default config; tagged in layer mode: "
          f"{len(tagged)} ({sum(o.layer == 'interface' for o in tagged)} through the interface, "
          f"{sum(o.layer == 'hooks' for o in tagged)} through module hooks); not tagged: {sum(o.layer == 'no tags' for o in built)}; "
          f"headcount failures: {sum('FAILED' in (o.layer, o.head) for o in built)}; not deterministic untagged: "
          f"{sum(o.deterministic is False for o in built)}; layer mode exact: {sum(bool(o.layer_exact) for o in tagged)}, "
          f"differs: {sum(o.layer_exact is False for o in tagged)}; head mode exact: {sum(o.head == 'exact' for o in built)}, "
          f"refused: {sum(o.head == 'refused' for o in built)}, split failed: {sum(o.head == 'split failed' for o in built)}, "
          f"differs: {sum(o.head == 'differs' for o in built)}; "
          f"ranges not nested: {sum(o.nested is False for o in tagged)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(o) for o in outcomes], fh, indent=1)
    return 1 if any("FAILED" in (o.layer, o.head) or o.head == "split failed" or o.nested is False for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
