"""Notebook widgets (ipywidgets): thin wrappers over the runner and plots.

  LiveRun(spec)        progress bar + a plot and a table that update as rows arrive
  Knobs(spec)          sliders / checkboxes for a few settings and a Run button
                       that re-runs a small experiment with them
  TokenStream(engine)  streams one request and colours its tokens: prompt tokens
                       reused from the KV cache, the rest of the prompt, output
                       tokens, and (once speculation lands) accepted draft tokens
  token_stream_html()  the HTML those colours are made of (pure function)

Everything also works headless (nbclient, plain Python): widgets are plain
objects there, and every action has a method (`run()`, `run_once()`,
`show()`) that returns its result instead of needing a click.
"""
from __future__ import annotations

import html
import time
from typing import Any, Callable, Sequence

import ipywidgets as W
from IPython.display import display

from colibri_lab import plots
from colibri_lab.experiments.blocks import close_engines
from colibri_lab.experiments.runner import Runner
from colibri_lab.experiments.spec import ExperimentSpec, Variant
from colibri_lab.experiments.stats import summary_table

# Colours of the token-stream view (background colours).
COLOURS = {
    "cached": "#c8e6c9",     # prompt token reused from the KV cache (not recomputed)
    "prompt": "#eeeeee",     # prompt token that was prefilled
    "output": "#ffffff",     # generated token
    "accepted": "#bbdefb",   # generated token that came from an accepted draft
}


class LiveRun:
    """Run a spec with a live view: a progress bar, a status line, a plot
    redrawn as rows arrive (at most every `min_interval` s) and, at the end,
    the summary table.

        live = LiveRun(spec, plot=plots.latency_cdf, plot_kwargs={"metric": "e2e_ms"})
        live            # shows the widget
        res = live.run()
    """

    def __init__(self, spec: ExperimentSpec, plot: Callable | None = plots.latency_cdf,
                 plot_kwargs: dict | None = None, min_interval: float = 1.0, engines: dict | None = None,
                 engine_factory: Callable | None = None):
        self.spec = spec
        self.plot = plot
        self.plot_kwargs = dict(plot_kwargs or {})
        self.min_interval = min_interval
        self.engines = engines
        self.engine_factory = engine_factory
        self.results = None
        self.progress = W.IntProgress(value=0, min=0, max=1, description=spec.name[:12],
                                      layout=W.Layout(width="60%"))
        self.status = W.HTML("not started")
        self.plot_out = W.Output()
        self.table_out = W.Output()
        self.widget = W.VBox([W.HBox([self.progress, self.status]), self.plot_out, self.table_out])
        self._last_draw = 0.0
        self.n_draws = 0

    def _ipython_display_(self):
        display(self.widget)

    def _draw(self, rows: list[dict]) -> None:
        if self.plot is None or not rows:
            return
        import pandas as pd

        df = pd.DataFrame(rows)
        try:
            fig = self.plot(df, **self.plot_kwargs)
        except Exception as exc:  # a partial frame may lack what the plot needs: say so, keep running
            with self.plot_out:
                self.plot_out.clear_output(wait=True)
                print(f"(plot not available yet: {exc})")
            return
        with self.plot_out:
            self.plot_out.clear_output(wait=True)
            display(fig)
        self.n_draws += 1

    def _on_row(self, row: dict, rows: list[dict]) -> None:
        self.progress.value = len(rows)
        err = f", <b>error</b>: {html.escape(row['error'])}" if row.get("error") else ""
        self.status.value = (f"{html.escape(str(row['variant']))} r{row['repeat']} · {len(rows)}/{self.progress.max}"
                             f" · e2e {row.get('e2e_ms', float('nan')):.0f} ms{err}")
        now = time.monotonic()
        if now - self._last_draw >= self.min_interval:
            self._last_draw = now
            self._draw(rows)

    def run(self):
        """Run the spec (blocking), updating the widget; returns Results."""
        kw: dict[str, Any] = {"progress": False, "on_row": self._on_row}
        if self.engines is not None:
            kw.update(engines=self.engines)
        if self.engine_factory is not None:
            kw["engine_factory"] = self.engine_factory
        runner = Runner(self.spec, **kw)
        self.progress.max = max(1, len(runner.variants) * self.spec.repeats * runner.workload.n_requests)
        self.progress.value = 0
        self.status.value = "running…"
        res = runner.run()
        self.results = res
        self._draw(res.requests.to_dict("records"))
        self.status.value = (f"done: {len(res.requests)} requests"
                             f"{' (interrupted)' if res.interrupted else ''}")
        with self.table_out:
            self.table_out.clear_output(wait=True)
            if len(res.requests):
                display(summary_table(res))
        return res


class Knobs:
    """Sliders and checkboxes over a base spec; "Run" re-runs it with the
    chosen values applied to every variant (engine settings, request settings
    and arrival), and shows a LiveRun.  Engines are kept between runs (keyed
    by settings) until close().

        k = Knobs(spec)      # shows n_threads, n_slots, concurrency, max_tokens, prefix_reuse
        k                    # display; or headless: res = k.run_once(n_slots=2)
    """

    DEFAULT_KNOBS = {
        "engine.n_threads": (1, 8, 1),
        "engine.n_slots": (1, 8, 1),
        "arrival.concurrency": (1, 8, 1),
        "request.max_tokens": (1, 256, 1),
        "engine.prefix_reuse": bool,
    }

    def __init__(self, spec: ExperimentSpec, knobs: dict | None = None, plot: Callable | None = plots.latency_cdf,
                 plot_kwargs: dict | None = None, engine_factory: Callable | None = None):
        self.spec = spec
        self.plot, self.plot_kwargs = plot, plot_kwargs
        self.engine_factory = engine_factory
        self.engines: dict = {}
        self.results = None
        base = spec.resolved_variants()[0]
        self.controls: dict[str, W.Widget] = {}
        if knobs is None:
            # a default knob over a setting the variants differ in would erase the A/B: leave it out
            rv = spec.resolved_variants()
            knobs = {k: r for k, r in self.DEFAULT_KNOBS.items()
                     if len({repr(getattr(v, k.split(".")[0]).get(k.split(".")[1])) for v in rv}) == 1}
        for key, rng in knobs.items():
            grp, name = key.split(".")
            cur = getattr(base, grp).get(name)
            if rng is bool:
                self.controls[key] = W.Checkbox(value=bool(cur if cur is not None else True), description=name)
            else:
                lo, hi, step = rng
                val = int(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) and cur >= lo else lo
                self.controls[key] = W.IntSlider(value=min(max(val, lo), hi), min=lo, max=hi, step=step,
                                                 description=name, continuous_update=False)
        self.button = W.Button(description="Run", button_style="primary", icon="play")
        self.button.on_click(lambda _b: self.run_once())
        self.out = W.Output()
        self.widget = W.VBox([W.HBox([W.VBox(list(self.controls.values())), self.button]), self.out])

    def _ipython_display_(self):
        display(self.widget)

    def values(self) -> dict[str, Any]:
        return {k: c.value for k, c in self.controls.items()}

    def spec_with(self, **overrides) -> ExperimentSpec:
        """The base spec with the knob values (plus keyword overrides, e.g.
        n_slots=2 for engine.n_slots) set in every variant."""
        vals = self.values()
        for k, v in overrides.items():
            full = [key for key in vals if key.split(".")[1] == k] or [k]
            vals[full[0]] = v
        variants = []
        for v in self.spec.variants:
            d = v.as_dict()
            for key, val in vals.items():
                grp, name = key.split(".")
                d[grp][name] = val
            variants.append(Variant(d["name"], d["engine"], d["request"], d["arrival"]))
        s = ExperimentSpec(**{**self.spec.__dict__, "variants": variants})
        return s

    def run_once(self, **overrides):
        """Run the spec with the current knob values; returns Results."""
        spec = self.spec_with(**overrides)
        for key, val in overrides.items():
            for k, c in self.controls.items():
                if k.split(".")[1] == key:
                    c.value = val
        live = LiveRun(spec, plot=self.plot, plot_kwargs=self.plot_kwargs, engines=self.engines,
                       engine_factory=self.engine_factory)
        self.out.clear_output(wait=True)
        with self.out:
            display(live.widget)
        self.button.disabled = True
        try:
            self.results = live.run()
        finally:
            self.button.disabled = False
        return self.results

    def close(self) -> None:
        close_engines(self.engines)


def token_stream_html(prompt_pieces: Sequence[str], output_pieces: Sequence[str], cached: int = 0,
                      accepted: Sequence[bool] | None = None, title: str | None = None) -> str:
    """HTML of a prompt and its output as coloured token spans.

    prompt_pieces / output_pieces: the text of each token; cached: how many
    leading prompt tokens were reused from the KV cache; accepted: per output
    token, True if it came from an accepted draft."""
    if cached < 0 or cached > len(prompt_pieces):
        raise ValueError(f"cached={cached} is outside 0..{len(prompt_pieces)}")
    if accepted is not None and len(accepted) != len(output_pieces):
        raise ValueError("accepted needs one flag per output token")

    def span(text: str, kind: str) -> str:
        t = html.escape(text).replace("\n", "↵<br>")
        return (f'<span class="cl-{kind}" style="background:{COLOURS[kind]};border-radius:2px;'
                f'margin:0 1px;white-space:pre-wrap">{t}</span>')

    parts = [span(p, "cached" if i < cached else "prompt") for i, p in enumerate(prompt_pieces)]
    parts.append('<span style="border-left:2px solid #e53935;margin:0 2px"></span>')
    for i, p in enumerate(output_pieces):
        parts.append(span(p, "accepted" if accepted is not None and accepted[i] else "output"))
    legend = " ".join(f'<span style="background:{c};padding:0 4px">{k}</span>' for k, c in COLOURS.items())
    n_acc = sum(bool(a) for a in accepted) if accepted is not None else 0
    head = (f"<div><b>{html.escape(title)}</b></div>" if title else "") + (
        f'<div style="font-size:small">{legend} · prompt {len(prompt_pieces)} tokens, '
        f"reused {cached}, output {len(output_pieces)}, accepted drafts {n_acc}</div>")
    return (f'<div style="font-family:monospace;font-size:12px;line-height:1.7">{head}'
            f'<div>{"".join(parts)}</div></div>')


class TokenStream:
    """Stream one request through an Engine and show its tokens live, coloured
    by origin (see token_stream_html).

        ts = TokenStream(eng); ts            # display
        info = ts.show(messages, max_tokens=32)
    """

    def __init__(self, engine, min_interval: float = 0.1):
        self.engine = engine
        self.min_interval = min_interval
        self.html = W.HTML("")
        self.widget = self.html
        self.last: dict | None = None

    def _ipython_display_(self):
        display(self.widget)

    def _pieces(self, ids) -> list[str]:
        return [self.engine.model.token_bytes(int(t)).decode("utf-8", errors="replace") for t in ids]

    def show(self, prompt, conversation: str | None = None, **kw) -> dict:
        """Run `prompt` (text, token ids, or a list of chat messages) and update
        the view as tokens arrive.  Returns {"html", "prompt_tokens",
        "output_tokens", "cached_tokens", "accepted", "metrics"}."""
        eng = self.engine
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            if conversation is None:
                conversation = eng.conversation_key(prompt)
            ids = eng.tokenize(eng.apply_chat_template(prompt), add_special=False)
        elif isinstance(prompt, str):
            ids = eng.tokenize(prompt)
        else:
            ids = [int(t) for t in prompt]
        ppieces = self._pieces(ids)
        out_ids: list[int] = []
        accepted: list[bool] = []
        metrics: dict = {}
        last = 0.0
        for ev in eng.stream_events(ids, conversation=conversation, **kw):
            if ev.get("done"):
                metrics = ev["metrics"]
                break
            out_ids.append(ev["token"])
            # engines with speculation mark tokens that came from an accepted draft
            accepted.append(bool(ev.get("drafted", False)))
            now = time.monotonic()
            if now - last >= self.min_interval:
                last = now
                self.html.value = token_stream_html(ppieces, self._pieces(out_ids), 0, accepted)
        cached = int(metrics.get("cached_tokens", 0))
        page = token_stream_html(ppieces, self._pieces(out_ids), min(cached, len(ppieces)), accepted,
                                 title=f"finish: {metrics.get('finish_reason', '?')}, "
                                       f"ttft {metrics.get('ttft_ms', 0):.0f} ms")
        self.html.value = page
        self.last = {"html": page, "prompt_tokens": ids, "output_tokens": out_ids, "cached_tokens": cached,
                     "accepted": accepted, "metrics": metrics}
        return self.last


class ExpertHeat:
    """MoE expert heat (layers x experts) of a live Engine, redrawn on refresh().

    A thin view over plots.expert_heatmap: the counts come from the engine's
    owner thread (Engine.scheduler.call), so it is safe while requests run."""

    def __init__(self, engine, normalize: bool = True):
        self.engine = engine
        self.normalize = normalize
        self.out = W.Output()
        self.button = W.Button(description="refresh")
        self.button.on_click(lambda _: self.refresh())
        self.box = W.VBox([self.button, self.out])

    def _ipython_display_(self):
        display(self.box)

    def counts(self):
        """int64 [n_layer, n_expert] routing counts over the engine's life."""
        return self.engine.scheduler.call(lambda core: core.expert_counts())

    def refresh(self):
        """Redraw from the current counts; returns the Figure (None for a dense model)."""
        counts = self.counts()
        self.out.clear_output(wait=True)
        if counts.shape[1] == 0:
            with self.out:
                print("dense model: no experts")
            return None
        fig = plots.expert_heatmap(counts, normalize=self.normalize)
        with self.out:
            display(fig)
        return fig
