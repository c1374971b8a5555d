"""Text: tokenizer assets, prompt template and the in-graph codec."""
