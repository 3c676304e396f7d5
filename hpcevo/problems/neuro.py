"""Neuroevolution: MLP policies on gymnax environments, whole episodes inside the jitted step.

A candidate is the flat parameter vector of a multilayer perceptron (weights then biases, layer
by layer, weights row-major ``(inputs, outputs)``), so ``dim`` is the number of MLP parameters
and any algorithm searches it as a point in R^dim. Its fitness is minus its return averaged over
``episodes`` episodes (fitness is minimised). Discrete actions: the argmax of the output layer;
continuous (Box) actions: ``tanh`` of the output, scaled to the action bounds.

Determinism: the episodes' keys depend on ``seed`` and the generation number only, never on the
candidate's position or the rank that evaluates it, so every rank count gives the same returns.
All candidates of one generation meet the same episodes (common random numbers: their ranking
compares policies, not luck), and each generation draws new ones, so a policy cannot fit a fixed
set of initial states. The loop passes the generation number (``Problem.wants_generation``).

Environments: gymnax [Lange22] (R. T. Lange, "gymnax: A JAX-based Reinforcement Learning
Environment Library", 2022, github.com/RobertTLange/gymnax), installed with
``pip install 'hpcevo[neuro]'``; any registered id works, e.g. CartPole-v1, Acrobot-v1,
Pendulum-v1, MountainCarContinuous-v0. An episode runs ``max_steps`` steps (default: the
environment's own limit) in a ``lax.scan``; rewards after the episode ends are masked out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import ConfigError, did_you_mean
from .base import Problem
from .numerical import _bounds

ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu, "elu": jax.nn.elu, "gelu": jax.nn.gelu,
               "sigmoid": jax.nn.sigmoid, "identity": lambda u: u}
DEFAULTS = {"hidden": [16], "activation": "tanh", "episodes": 4, "max_steps": 0, "seed": 0}
ARGS = ("env", *DEFAULTS)
# Weights start uniform in [lb, ub]; +-1 keeps tanh units out of saturation at first while
# allowing the decisive policies that solve the classic-control tasks.
LB, UB = -1.0, 1.0


def _gymnax():
    try:
        import gymnax
    except ImportError as e:
        raise ConfigError(f"neuro problems need gymnax: pip install 'hpcevo[neuro]' ({e})") from None
    return gymnax


@dataclass(frozen=True, eq=False)
class NeuroProblem(Problem):
    env_id: str
    layers: tuple[int, ...]  # observation size, hidden sizes..., output size
    activation: str
    episodes: int
    max_steps: int
    seed: int
    dim: int
    lb: tuple[float, ...]
    ub: tuple[float, ...]
    env: Any = field(repr=False)
    env_params: Any = field(repr=False)
    discrete: bool = True
    action_low: float = 0.0
    action_high: float = 0.0
    num_objectives: int = 1
    wants_generation: bool = True  # evaluate(x, generation): fresh episodes each generation

    @property
    def name(self) -> str:
        return "neuro"

    def unflatten(self, theta: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
        params, at = [], 0
        for n_in, n_out in zip(self.layers[:-1], self.layers[1:]):
            w = theta[at : at + n_in * n_out].reshape(n_in, n_out)
            at += n_in * n_out
            params.append((w, theta[at : at + n_out]))
            at += n_out
        return params

    def policy(self, params, obs: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        h = obs.astype(params[0][0].dtype)
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i < len(params) - 1:
                h = act(h)
        if self.discrete:
            return jnp.argmax(h)
        mid, half = (self.action_high + self.action_low) / 2, (self.action_high - self.action_low) / 2
        return mid + half * jnp.tanh(h)

    def episode_return(self, theta: jax.Array, key: jax.Array) -> jax.Array:
        params = self.unflatten(theta)
        k_reset, k_steps = jax.random.split(key)
        obs, state = self.env.reset(k_reset, self.env_params)

        def step(carry, k):
            obs, state, total, alive = carry
            action = self.policy(params, obs)
            # step_env, not step: step also computes a reset every step for its auto-reset,
            # which an episode that is masked out after its end does not need.
            obs2, state2, reward, terminated, _ = self.env.step_env(k, state, action, self.env_params)
            total = total + jnp.where(alive, reward, 0.0)
            ended = terminated | self.env.is_truncated(state2, self.env_params)
            # A finished episode stands still: no state wanders off to inf or NaN meanwhile.
            obs, state = jax.tree.map(lambda new, old: jnp.where(alive, new, old), (obs2, state2), (obs, state))
            return (obs, state, total, alive & ~ended), None

        init = (obs, state, jnp.zeros((), jnp.float32), jnp.ones((), bool))
        (_, _, total, _), _ = lax.scan(step, init, jax.random.split(k_steps, self.max_steps))
        return total

    def evaluate(self, x: jax.Array, generation: jax.Array | int = 0) -> jax.Array:
        """Minus the mean return of each row of ``x`` over the generation's episodes."""
        key = jax.random.fold_in(jax.random.PRNGKey(self.seed), generation)
        keys = jax.random.split(key, self.episodes)
        returns = jax.vmap(lambda theta: jax.vmap(lambda k: self.episode_return(theta, k))(keys))(x)
        return -jnp.mean(returns, axis=-1).astype(x.dtype)

    __call__ = evaluate


def _int(args: dict, key: str, low: int) -> int:
    v = args[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(f"neuro: problem.args.{key} must be an integer >= {low}, got {v!r}")
    return v


def make_neuro(dim: int | None, lb, ub, args: dict[str, Any]) -> NeuroProblem:
    unknown = sorted(set(args) - set(ARGS))
    if unknown:
        raise ConfigError(f"neuro: unknown key problem.args.{unknown[0]} (valid: {', '.join(ARGS)})")
    if "env" not in args:
        raise ConfigError("neuro: problem.args.env is required, e.g. env = \"CartPole-v1\"")
    a = {**DEFAULTS, **args}
    hidden = a["hidden"]
    if not isinstance(hidden, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden):
        raise ConfigError(f"neuro: problem.args.hidden must be a list of positive integers (hidden layer sizes), got {hidden!r}")
    if a["activation"] not in ACTIVATIONS:
        raise ConfigError(f"neuro: problem.args.activation {a['activation']!r} is not one of {', '.join(ACTIVATIONS)}")
    episodes, max_steps, seed = _int(a, "episodes", 1), _int(a, "max_steps", 0), _int(a, "seed", 0)

    gymnax = _gymnax()
    env_id = a["env"]
    if env_id not in gymnax.registered_envs:
        hint = did_you_mean(env_id, gymnax.registered_envs)
        raise ConfigError(f"neuro: unknown gymnax environment {env_id!r}{hint} (e.g. CartPole-v1, "
                         "Acrobot-v1, Pendulum-v1, MountainCarContinuous-v0)")
    env, env_params = gymnax.make(env_id)
    if max_steps:
        env_params = env_params.replace(max_steps_in_episode=max_steps)
    steps = int(env_params.max_steps_in_episode)
    space = env.action_space(env_params)
    obs_size = math.prod(env.observation_space(env_params).shape)
    discrete = hasattr(space, "n")
    if discrete:
        n_out, low, high = int(space.n), 0.0, 0.0
    else:
        if len(space.shape) > 1:
            raise ConfigError(f"neuro: {env_id} has actions of shape {space.shape}; only vectors are supported")
        n_out = int(math.prod(space.shape)) if space.shape else 1
        low, high = float(np.min(np.asarray(space.low))), float(np.max(np.asarray(space.high)))
    layers = (obs_size, *hidden, n_out)
    n_params = sum(i * o + o for i, o in zip(layers[:-1], layers[1:]))
    if dim is not None and dim != n_params:
        raise ConfigError(f"neuro: problem.dim = {dim}, but an MLP {'-'.join(map(str, layers))} has "
                         f"{n_params} parameters; leave problem.dim out, it follows from the network")
    return NeuroProblem(
        env_id=env_id, layers=layers, activation=a["activation"], episodes=episodes,
        max_steps=steps, seed=seed, dim=n_params,
        lb=_bounds("neuro", "lb", lb, LB, n_params), ub=_bounds("neuro", "ub", ub, UB, n_params),
        env=env, env_params=env_params, discrete=discrete, action_low=low, action_high=high,
    )
