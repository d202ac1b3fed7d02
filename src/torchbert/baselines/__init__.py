"""The models BERT is defined against, in the same engine: GPT (Radford et al., 2018; gpt.py), the
left-to-right Transformer, and ELMo (Peters et al., 2018; elmo.py), the feature-based BiLSTM LMs."""
