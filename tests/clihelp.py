"""Small helpers the command-line tests share."""

from torchbert.cli import main
from torchbert.samples import conll_text


def cli(capsys, *argv):
    """Run `torchbert ARGV...` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write_conll(path, sentences):
    """(words, tags) sentences as CoNLL: word TAB tag per line, a blank line after each sentence."""
    path.write_text(conll_text(sentences), encoding="utf-8")
