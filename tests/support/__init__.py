"""What tests, chaos and bench share: receivers (`receivers`), a running API (`api`), a
running worker and its settings (`worker`), subscriptions made directly in the database
(`subscriptions`). The pytest fixtures over them live in tests/conftest.py."""
