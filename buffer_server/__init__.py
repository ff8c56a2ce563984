"""Rollout buffer service: durable trajectory store (SQLite, WAL), GRPO group hand-out to slime,
and the agent runner that drives multi-turn episodes against SGLang and the eval server.
Not built yet; see the issue "Rollout buffer server"."""
