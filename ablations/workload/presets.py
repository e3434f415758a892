"""Named generator settings. How each number was chosen: README.md ("Presets")."""

from __future__ import annotations

from ablations.workload.generate import GeneratorConfig, LogNormal

AGENTX = GeneratorConfig(
    num_sessions=64,
    block_size=512,
    system_prompt_tokens=20_000,
    first_message=LogNormal(median=2_000, sigma=0.8, low=200, high=20_000),
    final_context=LogNormal(median=230_000, sigma=1.1, low=30_000, high=1_040_000),
    growth=LogNormal(median=3_000, sigma=0.5, low=800, high=12_000),
    min_turns=8,
    max_turns=90,
    output=LogNormal(median=490, sigma=1.0, low=16, high=8_000),
    tool_noise_sigma=1.0,
    min_tool_result=16,
    think_s=LogNormal(median=1.5, sigma=1.0, low=0.1, high=10.0),
    subagent_probability=0.02,
    max_subagents=2,
    subagent_turns=LogNormal(median=6, sigma=0.6, low=2, high=25),
    subagent_task=LogNormal(median=800, sigma=0.5, low=100, high=4_000),
    subagent_tool_result=LogNormal(median=1_500, sigma=1.0, low=16, high=20_000),
    subagent_fork="first_prompt",
    max_context_tokens=1_048_576,
    ramp_s=120.0,
    nominal_decode_tok_s=50.0,
    nominal_prefill_tok_s=20_000.0,
)

AGENTX_SMALL = GeneratorConfig(
    num_sessions=4,
    block_size=16,
    system_prompt_tokens=1_500,
    first_message=LogNormal(median=100, sigma=0.5, low=24, high=300),
    final_context=LogNormal(median=3_200, sigma=0.2, low=2_200, high=3_800),
    growth=LogNormal(median=32, sigma=0.3, low=20, high=64),
    min_turns=4,
    max_turns=70,
    output=LogNormal(median=14, sigma=0.5, low=4, high=48),
    tool_noise_sigma=0.6,
    min_tool_result=4,
    think_s=LogNormal(median=0.5, sigma=0.8, low=0.05, high=3.0),
    subagent_probability=0.05,
    max_subagents=2,
    subagent_turns=LogNormal(median=4, sigma=0.5, low=2, high=8),
    subagent_task=LogNormal(median=40, sigma=0.4, low=16, high=120),
    subagent_tool_result=LogNormal(median=32, sigma=0.6, low=8, high=160),
    subagent_fork="first_prompt",
    max_context_tokens=4_096,
    ramp_s=5.0,
    nominal_decode_tok_s=20.0,
    nominal_prefill_tok_s=500.0,
)

PRESETS: dict[str, GeneratorConfig] = {"agentx": AGENTX, "agentx_small": AGENTX_SMALL}


def preset(name: str) -> GeneratorConfig:
    """The generator config of a named preset (an unknown name is an error listing the valid ones)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset: unknown name {name!r}; valid choices: {', '.join(PRESETS)}") from None
