"""The entry points: HTTP (OpenAI-compatible and native), metrics, the DSL endpoint and
select scoring."""
