"""The entry points: one folder per API surface (openai/, responses/, anthropic/, native/, dsl/)
over a common HTTP core (core/); http_server.py puts the surfaces into one app."""
