"""`gossamer bench`: a load generator for any OpenAI-compatible endpoint (Gossamer, vLLM, SGLang,
TensorRT-LLM, hosted APIs), with workloads, vLLM-compatible metrics, result files and plots.

Modules: `workloads` (what to send), `client` (one streamed request -> one `RequestRecord`),
`loadgen` (when to send), `metrics` (records -> summary), `report` (result files, tables),
`plots` (matplotlib, imported only by `compare`), `cli` (the command line).
"""
