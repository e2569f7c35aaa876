"""Settings of the synthesis pipeline (``SANDPIT_SYNTH_*`` environment variables).

The model endpoint is any OpenAI-compatible server (OpenAI, vLLM, llama.cpp, a test
double): ``SANDPIT_SYNTH_BASE_URL``, ``SANDPIT_SYNTH_MODEL``, ``SANDPIT_SYNTH_API_KEY``.
The API key is a :class:`~pydantic.SecretStr`: it is never logged, never written to the
run manifest and never part of a cache key. Model requests go through
:class:`sandpit.client.llm.ModelClient` (:meth:`SynthSettings.model_client`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from sandpit.client.llm import ModelClient, ModelSettings


class SynthSettings(BaseSettings):
    """Everything ``sandpit synth`` reads from the environment (prefix ``SANDPIT_SYNTH_``)."""

    model_config = SettingsConfigDict(env_prefix="SANDPIT_SYNTH_", extra="ignore")

    base_url: str = "https://api.openai.com/v1"
    """OpenAI-compatible endpoint, including the ``/v1`` suffix."""
    model: str = "gpt-4o-mini"
    """Chat model for every generation and judging step."""
    api_key: SecretStr = SecretStr("")
    """Key for the model endpoint (sent as ``Authorization: Bearer``); empty sends ``EMPTY``
    (what vLLM expects when it has no key)."""
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    max_concurrency: int = Field(4, ge=1, le=256)
    """Model requests in flight at once (and items processed in parallel per stage)."""
    request_timeout_s: float = Field(120.0, gt=0)
    """Per model request, seconds."""
    retries: int = Field(4, ge=1, le=20)
    """Attempts per model request on 429, 5xx, timeouts and connection errors (tenacity)."""
    retry_backoff_s: float = Field(1.0, ge=0.0)
    """First backoff between attempts, seconds; doubles each attempt up to 30 s."""
    cache_dir: Path | None = None
    """On-disk request/response cache; ``<run dir>/llm_cache`` when unset."""
    attempts: int = Field(3, ge=1, le=20)
    """Regenerations of one malformed answer or invalid check function before giving up (N)."""
    embedding_model: str = "text-embedding-3-small"
    dedup: bool = True
    """De-duplicate near-identical environment descriptions (EnvScaler SkelBuilder stage 1, optional step)."""
    dedup_threshold: float = Field(0.92, ge=0.0, le=1.0)
    """Cosine similarity at or above which a description is a duplicate of an earlier one."""
    policy: Literal["strict", "standard", "audit"] = "standard"
    """Static policy for generated environment code (see ``/v1/validate``)."""
    test_configs_per_env: int = Field(1, ge=1, le=16)
    """Test initial states per environment for the quality check (EnvScaler stage 3 step 1)."""
    max_test_calls: int = Field(8, ge=1, le=64)
    """Tool calls the testing agent may make per test initial state."""
    min_pass_acc: float = Field(0.6, ge=0.0, le=1.0)
    """Keep an environment when pass / total >= this (EnvScaler ``pass_acc``)."""
    min_not_fail_acc: float = Field(0.8, ge=0.0, le=1.0)
    """... and (pass + warning) / total >= this (EnvScaler ``not_fail_acc``)."""
    scenarios_per_env: int = Field(2, ge=1, le=64)
    """Initial state configs (hence scenarios) per kept environment (ScenGenerator step 1)."""
    api_timeout_s: float = Field(120.0, gt=0)
    """Per Sandpit API call, seconds."""

    def model_settings(self) -> ModelSettings:
        """The model client's settings: ``retries`` here counts attempts, there the
        retries after the first; ``retry_backoff_s`` is the first backoff, capped at 30 s."""
        return ModelSettings(base_url=self.base_url, model=self.model, temperature=self.temperature,
                             request_timeout_s=self.request_timeout_s, retries=self.retries - 1,
                             retry_initial_s=self.retry_backoff_s, retry_max_s=30.0,
                             embedding_model=self.embedding_model)

    def model_client(self, cache_dir: Path) -> ModelClient:
        """A model client with these settings, the key, answers cached in ``cache_dir`` and
        at most ``max_concurrency`` requests in flight."""
        return ModelClient(self.model_settings(), self.api_key.get_secret_value() or None, cache_dir=cache_dir,
                           max_concurrency=self.max_concurrency)

    def public(self) -> dict[str, Any]:
        """The settings as JSON for the run manifest, without the API key."""
        data = self.model_dump(mode="json", exclude={"api_key"})
        data["api_key_set"] = bool(self.api_key.get_secret_value())
        return data


@lru_cache
def get_synth_settings() -> SynthSettings:
    """The process-wide settings (tests call ``get_synth_settings.cache_clear()``)."""
    return SynthSettings()
