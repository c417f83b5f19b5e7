"""Actor-critic networks for PPO over state vectors, images and action chunks.

The policy is a diagonal Gaussian over the flattened action (a chunk of ``K`` actions of
``A`` dims each is one ``K * A`` vector) with a state-independent log standard deviation;
the critic is a separate network. Observations are either a ``Box`` vector or a ``Dict``
whose float entries are concatenated into one state vector and whose ``uint8`` image
entries (``H x W x C``) each go through a small CNN.

Sources: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (Gaussian policy,
separate value network); Mnih et al. 2015 (the convolutional torso shape).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pipelined_vec_env.torch_observations import as_tensors

if TYPE_CHECKING:
    from .config import TrainConfig

__all__ = [
    "ActorCritic",
    "ObsBatch",
    "PolicyOutput",
    "RolloutPolicy",
    "RunningMeanStd",
    "action_dims_mask",
    "map_obs",
    "obs_to_tensor",
]

ObsBatch = torch.Tensor | dict[str, torch.Tensor]
"""A batch of observations on the policy device: one tensor ``(B, ...)`` or a dict of them."""


@dataclass
class PolicyOutput:
    """What the policy returns for a batch of ``B`` observations.

    Attributes:
        action: ``(B, *action_shape)`` float32, the unclipped sample (what log-probs refer to).
        logprob: ``(B,)`` float32, log-density of ``action`` under the current policy.
        value: ``(B,)`` float32, the critic's estimate of the (scaled) return.
    """

    action: torch.Tensor
    logprob: torch.Tensor
    value: torch.Tensor


class RolloutPolicy(Protocol):
    """What the rollout loop needs from a policy (``ActorCritic`` implements it)."""

    action_shape: tuple[int, ...]

    def act(self, obs: ObsBatch, noise: torch.Tensor | None) -> PolicyOutput:
        """Sample ``mean + std * noise`` (``noise`` ``(B, prod(action_shape))``; None: the mean)."""
        ...

    def get_value(self, obs: ObsBatch) -> torch.Tensor:
        """Return the critic's value ``(B,)`` for ``obs``."""
        ...


def map_obs(obs: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to an observation batch: to the array or tensor itself, or to each value
    of a dict of them (the keys kept). Works on numpy arrays and tensors alike.

    Examples:
        >>> import numpy as np
        >>> map_obs({"state": np.arange(4)}, lambda v: v[1:3])["state"].tolist()
        [1, 2]
    """
    if isinstance(obs, Mapping):
        return {key: fn(value) for key, value in obs.items()}
    return fn(obs)


def obs_to_tensor(obs: np.ndarray | dict[str, np.ndarray], device: torch.device) -> ObsBatch:
    """Convert a numpy observation batch to tensors on ``device``, keeping dtypes.

    Args:
        obs: an array ``(B, ...)`` or a dict of such arrays (a batched ``Dict`` space).
        device: the policy device.

    Returns:
        The same structure as tensors; ``uint8`` images stay ``uint8`` (the CNN scales them)
        and floating arrays become float32. On the CPU they share the arrays' memory; on
        a GPU they are uploaded with ``non_blocking=True`` (`as_tensors`: a DMA where the
        arrays are views of a vector env's page-locked buffers).
    """
    if isinstance(obs, dict):
        return {key: _array_to_tensor(value, device) for key, value in obs.items()}
    return _array_to_tensor(obs, device)


def _array_to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    array = np.asarray(array)
    dtype = np.uint8 if array.dtype == np.uint8 else np.float32
    return as_tensors(np.ascontiguousarray(array, dtype=dtype), device)


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches (parallel/Chan et al. update).

    Stored as buffers so they travel with ``state_dict`` (checkpoints).

    Args:
        shape: the shape of one sample.
        epsilon: initial pseudo-count, avoids division by zero before the first update.
    """

    def __init__(self, shape: Sequence[int] = (), epsilon: float = 1e-4) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(tuple(shape), dtype=torch.float64))
        self.register_buffer("var", torch.ones(tuple(shape), dtype=torch.float64))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Fold ``batch`` ``(N, *shape)`` into the statistics."""
        batch = batch.to(self.mean.device, torch.float64)
        batch_mean = batch.mean(dim=0)
        batch_var = batch.var(dim=0, unbiased=False)
        batch_count = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        new_mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count
        m2 = m2 + delta.pow(2) * self.count * batch_count / total
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor, clip: float = 10.0) -> torch.Tensor:
        """Return ``clip((x - mean) / sqrt(var + 1e-8), -clip, clip)`` as float32."""
        mean = self.mean.to(x.dtype)
        std = torch.sqrt(self.var + 1e-8).to(x.dtype)
        return torch.clamp((x - mean) / std, -clip, clip)


def _layer_init(layer: nn.Linear | nn.Conv2d, gain: float = math.sqrt(2.0)) -> nn.Module:
    """Orthogonal weights, zero bias (Saxe et al. 2014; common PPO practice)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, 0.0)
    return layer


def _mlp(in_dim: int, hidden_sizes: Sequence[int], out_dim: int, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    last = in_dim
    for size in hidden_sizes:
        layers += [_layer_init(nn.Linear(last, size)), nn.Tanh()]
        last = size
    layers.append(_layer_init(nn.Linear(last, out_dim), gain=out_gain))
    return nn.Sequential(*layers)


class ImageEncoder(nn.Module):
    """Small CNN for one ``uint8`` image ``(B, H, W, C)``, scaled to ``[0, 1]``.

    Args:
        image_shape: ``(H, W, C)``.
        feature_dim: size of the output feature vector.

    Raises:
        ValueError: if the image is smaller than the receptive field (36 x 36).
    """

    def __init__(self, image_shape: Sequence[int], feature_dim: int = 256) -> None:
        super().__init__()
        height, width, channels = (int(v) for v in image_shape)
        if height < 36 or width < 36:
            raise ValueError(f"images must be at least 36x36 for the CNN, got {height}x{width}")
        self.convs = nn.Sequential(
            _layer_init(nn.Conv2d(channels, 32, 8, stride=4)),
            nn.ReLU(),
            _layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            _layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, channels, height, width)).shape[1]
        self.head = nn.Sequential(_layer_init(nn.Linear(flat, feature_dim)), nn.ReLU())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Encode ``(B, H, W, C)`` uint8 to ``(B, feature_dim)`` float32."""
        x = image.permute(0, 3, 1, 2).float() / 255.0
        return self.head(self.convs(x))


def _is_image_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


class ObservationEncoder(nn.Module):
    """Turn a ``Box`` or ``Dict`` observation batch into one feature vector ``(B, F)``.

    Float entries are flattened, concatenated (sorted by key) and optionally normalised by
    running statistics shared with the caller; each image entry has its own CNN.

    Args:
        observation_space: the single-env observation space.
        obs_rms: running statistics of the concatenated state vector, or None.
        image_feature_dim: CNN output size per image.

    Raises:
        TypeError: for spaces other than ``Box`` or a ``Dict`` of ``Box``.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        obs_rms: RunningMeanStd | None,
        image_feature_dim: int = 256,
    ) -> None:
        super().__init__()
        self.obs_rms = obs_rms
        self.state_keys, self.image_keys, state_dim = _split_space(observation_space)
        self.is_dict = isinstance(observation_space, gym.spaces.Dict)
        self.image_encoders = nn.ModuleDict(
            {
                key: ImageEncoder(observation_space[key].shape, image_feature_dim)
                for key in self.image_keys
            }
        )
        self.state_dim = state_dim
        self.output_dim = state_dim + image_feature_dim * len(self.image_keys)

    def state_vector(self, obs: ObsBatch) -> torch.Tensor:
        """Concatenate the float entries of ``obs`` into ``(B, state_dim)`` float32."""
        if not self.is_dict:
            assert isinstance(obs, torch.Tensor)
            return obs.reshape(obs.shape[0], -1).float()
        assert isinstance(obs, dict)
        parts = [obs[key].reshape(obs[key].shape[0], -1).float() for key in self.state_keys]
        return torch.cat(parts, dim=-1)

    def forward(self, obs: ObsBatch) -> torch.Tensor:
        """Encode an observation batch to ``(B, output_dim)`` float32."""
        features = []
        if self.state_dim:
            state = self.state_vector(obs)
            if self.obs_rms is not None:
                state = self.obs_rms.normalize(state)
            features.append(state)
        if self.image_keys:
            assert isinstance(obs, dict)
            features += [self.image_encoders[key](obs[key]) for key in self.image_keys]
        return torch.cat(features, dim=-1)


def _split_space(space: gym.Space) -> tuple[list[str], list[str], int]:
    if isinstance(space, gym.spaces.Box) and not _is_image_space(space):
        return [], [], int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Dict):
        state_keys, image_keys, state_dim = [], [], 0
        for key in sorted(space.spaces):
            sub = space.spaces[key]
            if _is_image_space(sub):
                image_keys.append(key)
            elif isinstance(sub, gym.spaces.Box):
                state_keys.append(key)
                state_dim += int(np.prod(sub.shape))
            else:
                raise TypeError(f"unsupported observation entry {key!r}: {sub}")
        return state_keys, image_keys, state_dim
    raise TypeError(f"unsupported observation space {space}; use a Box or a Dict of Box")


def action_dims_mask(
    action_shape: Sequence[int], dims: Sequence[int], name: str
) -> torch.Tensor | None:
    """The 0/1 float mask over a flattened action of shape ``action_shape`` (``(A,)`` or an
    action chunk ``(K, A)``) that is 1 at dimensions ``dims`` of every action; None for
    no dims.

    Raises:
        ValueError: for an index outside ``[0, A)``, naming the flag ``name``.

    Examples:
        >>> action_dims_mask((2, 3), [2], "dims").tolist()
        [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    """
    if not dims:
        return None
    per_action = int(action_shape[-1])
    if not all(0 <= d < per_action for d in dims):
        raise ValueError(f"{name}: expected indices in [0, {per_action}), got {list(dims)}")
    mask = torch.zeros(per_action)
    mask[list(dims)] = 1.0
    return mask.repeat(int(np.prod(action_shape)) // per_action)


class ActorCritic(nn.Module):
    """Gaussian actor and separate critic over state vectors, images or both.

    Args:
        observation_space: single-env observation space (``Box`` or ``Dict`` of ``Box``).
        action_space: single-env ``Box`` action space, e.g. ``(A,)`` or an action chunk
            ``(K, A)``.
        hidden_sizes: MLP hidden layer sizes for both actor and critic.
        init_log_std: initial log standard deviation of every action dimension.
        normalize_obs: keep running statistics of the state vector and normalise with them.

    Raises:
        TypeError: for a non-``Box`` action space or an unsupported observation space.

    Examples:
        >>> import gymnasium as gym, numpy as np, torch
        >>> obs_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        >>> act_space = gym.spaces.Box(-1, 1, (2, 3), np.float32)
        >>> agent = ActorCritic(obs_space, act_space, hidden_sizes=(8,))
        >>> out = agent.act(torch.zeros(5, 4), noise=torch.zeros(5, 6))
        >>> tuple(out.action.shape), tuple(out.logprob.shape), tuple(out.value.shape)
        ((5, 2, 3), (5,), (5,))
    """

    @classmethod
    def from_config(
        cls, config: TrainConfig, observation_space: gym.Space, action_space: gym.Space
    ) -> ActorCritic:
        """The agent a `TrainConfig` describes (`hidden_sizes`, `init_log_std`,
        `normalize_obs`) for one env's spaces, on the CPU (move it with `.to(device)`)."""
        return cls(
            observation_space,
            action_space,
            hidden_sizes=config.hidden_sizes,
            init_log_std=config.init_log_std,
            normalize_obs=config.normalize_obs,
        )

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int] = (64, 64),
        init_log_std: float = 0.0,
        normalize_obs: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box):
            raise TypeError(f"ActorCritic needs a Box action space, got {action_space}")
        self.action_shape: tuple[int, ...] = tuple(int(v) for v in action_space.shape)
        self.action_dim = int(np.prod(self.action_shape))
        _, _, state_dim = _split_space(observation_space)
        self.obs_rms = RunningMeanStd((state_dim,)) if normalize_obs and state_dim else None
        self.actor_encoder = ObservationEncoder(observation_space, self.obs_rms)
        self.critic_encoder = ObservationEncoder(observation_space, self.obs_rms)
        self.actor_mean = _mlp(self.actor_encoder.output_dim, hidden_sizes, self.action_dim, 0.01)
        self.critic = _mlp(self.critic_encoder.output_dim, hidden_sizes, 1, 1.0)
        self.actor_log_std = nn.Parameter(torch.full((self.action_dim,), float(init_log_std)))
        # which flattened action entries explore (None: all); not saved in checkpoints
        self.explore_mask: torch.Tensor | None = None

    def set_log_std(self, log_std: Sequence[float], name: str = "log_std") -> None:
        """Set the log std per action dimension, repeated over an action chunk.

        Args:
            log_std: one value per dimension of one action (``A`` of ``(K, A)``), or one
                per flattened entry.
            name: what the error calls ``log_std`` (the caller's flag).

        Raises:
            ValueError: if the action size is not a multiple of ``len(log_std)``.
        """
        size = self.actor_log_std.numel()
        if not log_std or size % len(log_std):
            raise ValueError(
                f"{name}: {len(log_std)} values do not divide the action size "
                f"{size} (action shape {self.action_shape}); give one value per action dimension"
            )
        values = torch.tensor(list(log_std), dtype=self.actor_log_std.dtype)
        with torch.no_grad():
            self.actor_log_std.copy_(
                values.repeat(size // len(log_std)).to(self.actor_log_std.device)
            )

    def set_explore_dims(self, dims: Sequence[int], name: str = "dims") -> None:
        """Explore only along these action dimensions (repeated over an action chunk).

        The other dimensions act with their mean: no noise, and they are left out of
        log-probabilities and entropy (so PPO does not move them directly). Empty: all
        dimensions explore.

        Args:
            dims: indices into the last action axis (``A`` of ``(K, A)``).
            name: what the error calls ``dims`` (the caller's flag).

        Raises:
            ValueError: for an index outside ``[0, A)``.
        """
        mask = action_dims_mask(self.action_shape, dims, name)
        self.explore_mask = None if mask is None else mask.to(self.actor_log_std.device)

    def _distribution(self, obs: ObsBatch) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.actor_mean(self.actor_encoder(obs))
        return mean, self.actor_log_std.expand_as(mean)

    def distribution(self, obs: ObsBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's mean and log std, both ``(B, action_dim)`` float32 (flattened)."""
        return self._distribution(obs)

    def get_value(self, obs: ObsBatch) -> torch.Tensor:
        """Return the value estimate ``(B,)`` float32."""
        return self.critic(self.critic_encoder(obs)).squeeze(-1)

    def act(self, obs: ObsBatch, noise: torch.Tensor | None) -> PolicyOutput:
        """Sample actions as ``mean + std * noise``; ``noise=None`` gives the mean.

        Taking the noise from the caller lets the rollout draw it for a whole rollout up
        front, so that which env is inferred in which batch does not change the samples.

        Args:
            obs: observation batch of ``B`` envs.
            noise: standard normal ``(B, action_dim)``, or None for the deterministic policy.

        Returns:
            ``PolicyOutput`` with actions shaped ``(B, *action_shape)``.
        """
        mean, log_std = self._distribution(obs)
        if noise is not None and self.explore_mask is not None:
            noise = noise * self.explore_mask
        action = mean if noise is None else mean + log_std.exp() * noise
        logprob = _gaussian_logprob(action, mean, log_std, self.explore_mask)
        value = self.get_value(obs)
        return PolicyOutput(action.reshape(-1, *self.action_shape), logprob, value)

    def evaluate(
        self, obs: ObsBatch, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-prob, entropy and value of stored actions (for the PPO loss).

        Args:
            obs: observation batch of ``B`` envs.
            action: ``(B, *action_shape)`` the unclipped actions taken.

        Returns:
            ``(logprob, entropy, value)``, each ``(B,)`` float32.
        """
        mean, log_std = self._distribution(obs)
        flat = action.reshape(action.shape[0], -1)
        logprob = _gaussian_logprob(flat, mean, log_std, self.explore_mask)
        per_dim = 0.5 + 0.5 * math.log(2 * math.pi) + log_std
        if self.explore_mask is not None:
            per_dim = per_dim * self.explore_mask
        entropy = per_dim.sum(-1)
        return logprob, entropy, self.get_value(obs)

    @torch.no_grad()
    def update_obs_rms(self, obs: ObsBatch) -> None:
        """Fold a batch of raw observations into the running state statistics (no-op if off)."""
        if self.obs_rms is not None:
            self.obs_rms.update(self.actor_encoder.state_vector(obs))


def _gaussian_logprob(
    x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Sum over dims (those with ``mask`` 1) of the diagonal Gaussian log-density;
    ``(B, D) -> (B,)``."""
    z = (x - mean) * torch.exp(-log_std)
    per_dim = -0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    if mask is not None:
        per_dim = per_dim * mask
    return per_dim.sum(-1)
