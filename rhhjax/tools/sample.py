r"""Generate text from a trained model.

    python -m rhhjax.tools.sample --workdir=workdirs/ptb --prompt="the " --length=300 \
        --temperature=0.8 [--seed=0] [--checkpoint=best|latest|STEP] [--output=FILE.txt]

Only the checkpoint is read; how the text is drawn: ``rhhjax.sampling``.
"""

from __future__ import annotations

from rhhjax import outputs
from rhhjax.sampling import generate


def run(
    workdir: str,
    prompt: str,
    length: int,
    temperature: float,
    seed: int = 0,
    which: str = "best",
) -> str:
    """Prompt + generated text from a checkpoint of ``workdir`` (bytes decoded as UTF-8)."""
    from rhhjax.train.saved_run import load_run

    saved = load_run(workdir, which)
    out = generate(saved.model, saved.params, saved.vocab, prompt, length, temperature, seed)
    if isinstance(out, bytes):
        out = out.decode("utf-8", errors="replace")
    return prompt + out


def main(argv: list[str]) -> int:
    from absl import flags

    f = flags.FLAGS
    if f.output:
        outputs.check_file(f.output, "--output")
    text = run(f.workdir, f.prompt, f.length, f.temperature, f.seed, f.checkpoint)
    print(text)
    if f.output:
        outputs.write_text(f.output, text, "--output")
    return 0


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints.", required=True)
    flags.DEFINE_string("prompt", "the ", "Text to start from (every character in the vocab).")
    flags.DEFINE_integer("length", 300, "Characters to generate.")
    flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 = greedy.")
    flags.DEFINE_integer("seed", 0, "Sampling seed.")
    flags.DEFINE_string(
        "checkpoint", "best", "best | latest | STEP (a saved step) | checkpoints/STEP | best/STEP."
    )
    flags.DEFINE_string("output", "", "Also write the text to this file (UTF-8).")


def console() -> None:
    from rhhjax import cli

    cli.run_program(main, define_flags, __doc__, flag=None)


if __name__ == "__main__":
    console()
