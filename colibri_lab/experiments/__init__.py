"""Experiments API: workloads, variants, a runner that A/B-tests them, results
as tidy DataFrames with provenance, and paired statistics.

    from colibri_lab.experiments import ExperimentSpec, Variant, run, summary_table
    spec = ExperimentSpec("tour", workload="shared_prefix", workload_n=6, repeats=2,
                          engine={"n_threads": 2, "n_slots": 2}, request={"max_tokens": 16},
                          variants=[Variant("reuse-off", engine={"prefix_reuse": False}),
                                    Variant("reuse-on", engine={"prefix_reuse": True})],
                          lossless=True)
    res = run(spec)
    summary_table(res)

or from a TOML file: run_spec("experiments/tour.toml").  A spec with a [serve]
table sends the workload over HTTP to servers instead (serve_bench, loadgen):
run_spec("experiments/serving.toml"); serve_table(res).
"""
from colibri_lab.experiments.results import Results, latest_results, load_results  # noqa: F401
from colibri_lab.experiments.runner import Runner, block_order, run, run_spec, tokens_hash  # noqa: F401
from colibri_lab.experiments.spec import (  # noqa: F401
    ExperimentSpec,
    Variant,
    load_spec,
    small_mode,
    spec_from_dict,
    sweep,
)
from colibri_lab.experiments.stats import (  # noqa: F401
    acceptance_by_position,
    acceptance_by_source,
    json_validity,
    block_throughput,
    bootstrap_ci,
    bootstrap_mean_ci,
    compare,
    earns_its_keep,
    numerics_table,
    output_equality,
    prefix_cache_hit_rate,
    summarize,
    summary_table,
)
from colibri_lab.experiments.numerics import compare_sequence  # noqa: F401
from colibri_lab.experiments.workloads import BUILTIN, Arrival, Item, Workload, load_workload  # noqa: F401
from colibri_lab.experiments.distributed import DaskBackend, TaskFailedError, use_backend  # noqa: F401
from colibri_lab.experiments.loadgen import Target, metrics_delta, parse_slo, run_block, trace_metrics  # noqa: F401
from colibri_lab.experiments.serve_bench import (  # noqa: F401
    ServeRunner,
    max_rate_meeting,
    percentile_ratio,
    run_serving,
    serve_table,
)
