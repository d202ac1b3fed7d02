"""BERT's pretraining recipes, by name: overrides of `pretrain`'s settings (train/pretrain.py PretrainSettings)
beside a budget's steps, batch and learning rate.

  paper   Devlin et al.'s: learned absolute positions, post-LN, MLM + NSP, dropout 0.1.
  rotary  the same with RoFormer's rotary positions (Su et al., 2021): each head's queries and keys
          turned by their position, so that attention to neighbours, what a masked token most needs,
          is there from the first step. bench/bench_recipes.py measured it to learn fastest of the
          probes on 2 CPU cores (bench/README.md, "What pretraining learns"); its checkpoints are
          RoFormer's, which transformers loads.

`demo` and `compare` take one with --recipe (the default: DEFAULT), and so does `pretrain` (train/pretrain.py
with_recipe: no --recipe there is the paper's, a checkpoint transformers' BertForPreTraining loads).

One recipe continues a checkpoint instead (`pretrain --init CHECKPOINT --recipe continue`: CONTINUE):

  continue  a public BERT's pretraining continued on the user's corpus (Gururangan et al., 2020: domain-
            and task-adaptive pretraining): the masked LM alone, as RoBERTa and the DAPT/TAPT runs train
            (a checkpoint's NSP head, where it has one, has nothing left to learn from a new corpus), at
            the highest of the peak rates tried on continuing MiniLM (2e-5 to 2e-4: held-out MLM accuracy
            after 150 steps rose with the rate; bench/README.md, "Continuing a checkpoint"), warmup a
            tenth of those steps. What it does to fine-tuning scores is measured there task by task.
"""

RECIPES: dict[str, dict[str, object]] = {"paper": {}, "rotary": {"positions": "rotary"}}
TEXT = {"paper": "the paper's recipe: learned absolute positions, MLM + NSP",
        "rotary": "rotary positions (RoFormer), otherwise the paper's recipe (MLM + NSP)"}
DEFAULT = "rotary"

# what --recipe continue sets, beside --init: the objective (PretrainSettings) and the loop's rate and warmup
# (TrainConfig); a flag given beside it wins
CONTINUE: dict[str, object] = {"objective": "mlm", "lr": 2e-4, "warmup_steps": 15}
