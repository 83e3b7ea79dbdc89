"""Producing experience: rollout workers stepping their env splits, and inference
(inside each worker, or batched in policy workers) choosing their actions."""
