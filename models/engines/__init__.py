"""Generation engines behind one interface (`base.GenerationEngine`): `hf.HFEngine` (transformers, in process),
`vllm_engine.VLLMEngine` (vLLM, in process, GPU) and `openai_http.OpenAIEngine` (an OpenAI-compatible server)."""
