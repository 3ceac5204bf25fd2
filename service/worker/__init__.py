"""The delivery worker: wake-ups, fan-out, claims, delivery, recording, retries."""
