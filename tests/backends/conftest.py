"""Fixtures shared by the backend tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def restore_torch_threads():
    """The async and off-policy runs set torch's thread count (one per process on 2 cores): put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
