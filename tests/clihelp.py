"""Small helpers the command-line tests share."""

from torchbert.cli import main


def cli(capsys, *argv):
    """Run `torchbert ARGV...` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write_conll(path, sentences):
    """(words, tags) sentences as CoNLL: word TAB tag per line, a blank line after each sentence."""
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(*s)) + "\n" for s in sentences), encoding="utf-8")
