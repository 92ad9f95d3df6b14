"""gpt-oss-mini: the small GPT-OSS model Gossamer trains itself and ships as its default model.

corpus.py builds the text (CPython stdlib source + Harmony chats from its docstrings), tokenizer.py
trains the byte-level BPE, model.py is the training twin of transformers' GptOssForCausalLM,
train.py runs the whole pipeline, export.py writes the Hugging Face checkpoint, evaluate.py
measures held-out loss with transformers as the independent oracle.
"""
