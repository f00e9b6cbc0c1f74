// Conclave's web view: the list of jobs, one job's live page, the sign-in form.
// Every string that comes from the server is model text or derived from it, so it is only ever set
// with textContent (or as an attribute value): never innerHTML, never a template into markup. The page
// runs under a Content-Security-Policy with no inline script (server/web/routes.py).
// The session key lives in this tab's sessionStorage and goes out only in the X-Conclave-Session header
// of this script's own requests: no cookie, so no other port of this host ever sees it
// (server/web/sessions.py says why).
"use strict";

// The session ------------------------------------------------------------------------------------------
const SESSION = "conclave-session";

function session() {
  try { return JSON.parse(sessionStorage.getItem(SESSION)); } catch (error) { return null; }
}

function signIn(next) {
  const here = location.pathname + location.search;
  location.replace("/login?next=" + encodeURIComponent(next || here));
}

class SignedOut extends Error {}

// A request with the session's header; no session, or a refused one, goes to the sign-in page.
async function api(path, options) {
  const current = session();
  if (!current || !current.key) { signIn(); throw new SignedOut("not signed in"); }
  const headers = Object.assign({}, (options || {}).headers, { "X-Conclave-Session": current.key });
  const response = await fetch(path, Object.assign({}, options, { headers, credentials: "omit", cache: "no-store" }));
  if (response.status === 401) { sessionStorage.removeItem(SESSION); signIn(); throw new SignedOut("signed out"); }
  return response;
}

function startBar() {
  const current = session();
  if (!current || !current.key) { signIn(); return false; }
  setText("who", "signed in as " + current.caller);
  document.getElementById("sign-out").addEventListener("click", async () => {
    try { await api("/api/sign-out", { method: "POST" }); } catch (error) { /* signed out either way */ }
    sessionStorage.removeItem(SESSION);
    location.replace("/login");
  });
  return true;
}

function el(tag, props, children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "cls") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, String(value));
    else node[key] = value;
  }
  for (const child of children || []) if (child) node.append(child);
  return node;
}

function fill(id, children) {
  const node = document.getElementById(id);
  node.replaceChildren(...children.filter(Boolean));
  return node;
}

function setText(id, text) {
  document.getElementById(id).textContent = text === null || text === undefined ? "" : String(text);
}

function live(text) { setText("live", text); }

const FINAL = new Set(["completed", "failed", "cancelled", "interrupted"]);
const money = (usd) => (usd === null || usd === undefined ? "-" : "$" + usd.toFixed(4));
// a usage's cost: a lower bound when some of its tokens came without one, "~" when some are an
// estimate for calls that reported nothing (backends/base.py Usage)
const approx = (u) => (u.estimated_input_tokens && u.cost_usd !== null && u.cost_usd !== undefined ? "~" : "");
const cost = (u) => (u.cost_usd !== null && u.cost_usd !== undefined && u.uncosted_tokens > 0
  ? "≥ " + approx(u) + money(u.cost_usd) + " (partial)" : approx(u) + money(u.cost_usd));
const count = (n) => Number(n || 0).toLocaleString("en-US");
// of the input tokens, those estimated (Usage.estimated_input_tokens), e.g. "~1,200"
const estimated = (u) => (u.estimated_input_tokens ? "~" + count(u.estimated_input_tokens) : "-");
// a member's part of the job's tokens (AgentProgress.token_share, 0 to 1), e.g. "41%"
const share = (a) => (a.token_share === null || a.token_share === undefined ? "-" : Math.round(a.token_share * 100) + "%");
const limit = (a) => (a.max_tokens ? " of " + count(a.max_tokens) : "");
const secs = (s) => Number(s || 0).toFixed(1) + " s";

// <details> stay open across re-renders: their keys are remembered when the reader toggles them.
const opened = new Set();
document.addEventListener("toggle", (event) => {
  const key = event.target.dataset && event.target.dataset.key;
  if (!key) return;
  if (event.target.open) opened.add(key); else opened.delete(key);
}, true);

function details(key, summary, body) {
  const node = el("details", { "data-key": key }, [el("summary", { text: summary }), body]);
  node.open = opened.has(key);
  return node;
}

// The job page ---------------------------------------------------------------------------------------
function jobId() {
  return decodeURIComponent(location.pathname.replace(/^\/jobs\//, "").replace(/\/$/, ""));
}

function picture(view) {
  return view.progress || { round: 0, agents: [] };  // the team's live picture (JobView.progress)
}

function outcome(view) {
  const result = view.result || {};  // how the job ended, once it has (JobView.result)
  const lines = [];
  if (result.winner) {
    lines.push(el("p", { cls: "winner" }, [
      el("span", { text: "Winner " }), el("strong", { text: result.winner, "data-winner": result.winner }),
      el("span", { cls: result.consensus ? "badge ok" : "badge warn", text: result.consensus ? "consensus" : "no consensus" }),
    ]));
    if (view.majority) lines.push(el("p", { text: view.majority }));
    if (result.tie) lines.push(el("p", { text: "A tie, broken by the earliest-posted answer." }));
    if (result.fallback) lines.push(el("p", { text: "The vote did not finish: the best-supported answer so far won." }));
    if (view.winner_check) lines.push(el("p", { text: "Its check: " + view.winner_check }));
  } else if (picture(view).leading) {
    const leading = picture(view).leading;
    lines.push(el("p", { text: `Leading: ${leading.label} with ${leading.votes} vote(s)` +
      (leading.check ? `, check ${leading.check}` : "") }));
  } else if (!FINAL.has(view.state)) {
    lines.push(el("p", { cls: "muted", text: "No votes yet." }));
  }
  if (result.reason) lines.push(el("p", { cls: "muted", text: "Why: " + result.reason }));
  for (const [who, error] of Object.entries(result.errors || {})) lines.push(el("p", { cls: "error", text: `${who}: ${error}` }));
  return lines;
}

function tally(view) {
  const groups = view.by_answer || [];  // grouped by the server (JobView.by_answer): the final tally once done
  if (!groups.length) return [el("p", { cls: "muted", text: "No valid votes." })];
  const most = Math.max(1, ...groups.map((g) => g.votes));
  return groups.map(({ labels, votes }) => {
    const bar = el("span", { cls: "meter-fill" });
    bar.style.width = Math.round((100 * votes) / most) + "%";
    return el("div", { cls: "tally-row", "data-group": labels.join(" "), "data-votes": String(votes) }, [
      el("span", { cls: "mono", text: labels.join(" = ") }),
      el("span", { cls: "meter" }, [bar]),
      el("span", { text: `${votes} vote${votes === 1 ? "" : "s"}` }),
      labels.length > 1 ? el("span", { cls: "muted small", text: "same final answer" }) : null,
    ]);
  });
}

function usage(view) {
  const head = el("tr", {}, ["agent", "model", "calls", "in", "cached", "out", "cost", "share", "estimated in"].map((h) => el("th", { text: h })));
  const rows = picture(view).agents.map((a) => el("tr", { "data-letter": a.letter }, [
    el("td", { text: a.letter }), el("td", { cls: "mono", text: a.model }), el("td", { text: count(a.usage.calls) }),
    el("td", { text: count(a.usage.input_tokens) }), el("td", { text: count(a.usage.cached_input_tokens) }),
    el("td", { text: count(a.usage.output_tokens) }), el("td", { text: cost(a.usage) }), el("td", { text: share(a) }),
    el("td", { text: estimated(a.usage) }),
  ]));
  const u = view.usage;
  const total = el("tr", { cls: "total" }, [
    el("td", { text: "all" }), el("td"), el("td", { text: count(u.calls) }), el("td", { text: count(u.input_tokens) }),
    el("td", { text: count(u.cached_input_tokens) }), el("td", { text: count(u.output_tokens) }), el("td", { text: cost(u) }),
    el("td", { text: u.input_tokens + u.output_tokens > 0 ? "100%" : "-" }), el("td", { text: estimated(u) }),
  ]);
  return [el("thead", {}, [head]), el("tbody", {}, [...rows, total])];
}

function answerCard(card, winner) {
  const check = card.check ? el("span", { cls: "badge check-" + (card.check_status || ""), text: "check " + card.check }) : null;
  const head = el("div", { cls: "answer-head" }, [
    el("strong", { cls: "mono", text: card.label }),
    card.label === winner ? el("span", { cls: "badge ok", text: "winner" }) : null,
    card.latest ? el("span", { cls: "muted small", text: `${card.votes} vote${card.votes === 1 ? "" : "s"}` })
      : el("span", { cls: "muted small", text: "replaced" }),
    check,
  ]);
  const body = el("pre", { cls: "text answer-text", text: card.content });
  const output = card.check_output ? details("out:" + card.label, "check output", el("pre", { cls: "text small", text: card.check_output })) : null;
  return el("article", { cls: card.latest ? "answer latest" : "answer old", "data-label": card.label }, [head, body, output]);
}

function agentColumn(agent, cards, winner) {
  const vote = agent.vote ? `votes for ${agent.vote}` : "no vote";
  const u = agent.usage;
  const older = cards.filter((c) => !c.latest).reverse();
  const latest = cards.filter((c) => c.latest);
  return el("div", { cls: "agent state-" + agent.state, "data-letter": agent.letter }, [
    el("div", { cls: "agent-head" }, [
      el("span", { cls: "letter", text: agent.letter }),
      el("span", { cls: "mono model", text: agent.model }),
      el("span", { cls: "badge", text: agent.state }),
    ]),
    el("div", { cls: "agent-meta" }, [
      el("span", { cls: "vote", text: vote }),
      el("span", { cls: "muted small spend", text: `${count(u.input_tokens)} in (${count(u.cached_input_tokens)} cached${u.estimated_input_tokens ? ", " + estimated(u) + " estimated" : ""}) / ${count(u.output_tokens)} out${limit(agent)} · ${share(agent)} · ${cost(u)}` }),
    ]),
    agent.error ? el("p", { cls: "error", text: agent.error }) : null,
    ...latest.map((c) => answerCard(c, winner)),
    older.length ? details("older:" + agent.letter, `${older.length} earlier revision${older.length === 1 ? "" : "s"}`,
      el("div", {}, older.map((c) => answerCard(c, winner)))) : null,
    cards.length ? null : el("p", { cls: "muted", text: "no answer yet" }),
  ]);
}

function diffLines(text) {
  return text.split("\n").map((line) => {
    let cls = "";
    if (line.startsWith("diff --git") || line.startsWith("index ") || line.startsWith("--- ") || line.startsWith("+++ ")) cls = "d-file";
    else if (line.startsWith("@@")) cls = "d-hunk";
    else if (line.startsWith("+")) cls = "d-add";
    else if (line.startsWith("-")) cls = "d-del";
    return el("span", { cls: "d-line " + cls, text: line + "\n" });
  });
}

function timeline(moments) {
  return moments.map((m, index) => el("li", { cls: "moment kind-" + m.kind, "data-kind": m.kind }, [
    el("span", { cls: "at mono", text: secs(m.at) }),
    el("span", { cls: "what", text: m.text }),
    m.body && m.kind.startsWith("vote") ? el("span", { cls: "muted reason", text: "  " + m.body }) : null,
    m.body && !m.kind.startsWith("vote") ? details(`t:${index}:${m.kind}`, m.kind === "answer" ? "the answer" : "details",
      el("pre", { cls: "text small", text: m.body })) : null,
  ]));
}

function renderJob(page) {
  const view = page.view;
  const result = view.result || {};
  document.title = `Conclave - ${view.job_id} - ${view.state}`;
  setText("job-id", view.job_id);
  setText("team", "team " + view.team);
  const state = document.getElementById("state");
  state.textContent = view.state;
  state.className = "badge state-" + view.state;
  setText("phase", `${view.phase} · round ${picture(view).round} · ${secs(view.elapsed_s)}`);
  setText("task", page.task);
  document.getElementById("cancel").hidden = FINAL.has(view.state);
  fill("winner", outcome(view));
  fill("tally", tally(view));
  fill("usage", usage(view));
  fill("agents", picture(view).agents.map((agent) => agentColumn(agent, page.answers[agent.letter] || [], result.winner)));
  document.getElementById("final-section").hidden = result.answer === null || result.answer === undefined;
  setText("final", result.answer);
  document.getElementById("diff-section").hidden = page.diff === null || page.diff === undefined;
  setText("diff-note", page.diff_cut ? "The patch is cut here; read_workspace(path='@diff') pages through all of it." :
    page.diff === "" ? "The winner changed no files." : "");
  fill("diff", page.diff ? diffLines(page.diff) : []);
  // held-back changes and files that run code on their own (.envrc, .vscode/tasks.json, ...), with why
  fill("file-notes", (page.file_notes || []).map((note) => el("li", { cls: "file-note", text: note })));
  fill("timeline", timeline(page.timeline));
  if (!document.body.dataset.seq) performance.mark("conclave:first-render");  // bench/bench_web.py reads it
  document.body.dataset.state = view.state;
  document.body.dataset.seq = String(page.seq);
}

// The event stream, read with fetch (EventSource sends no headers): `job` pages, then `end`.
async function follow(id) {
  for (;;) {
    let response;
    try {
      response = await api(`/api/jobs/${encodeURIComponent(id)}/events`);
    } catch (error) {
      if (error instanceof SignedOut) return;
      live("reconnecting...");
      await new Promise((resolve) => setTimeout(resolve, 2000));
      continue;
    }
    if (response.status === 404) { live("no such job here (or not yours)"); return; }
    if (!response.ok) { live("refused: " + response.status); return; }
    live("live");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let kind = "message";
          const data = [];
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          }
          if (kind === "job") renderJob(JSON.parse(data.join("\n")));
          else if (kind === "end") { live("job over"); return; }
          else if (kind === "gone") { live("this job is gone (pruned)"); return; }
          else if (kind === "refused") { sessionStorage.removeItem(SESSION); signIn(); return; }
        }
      }
    } catch (error) { /* the connection dropped: open it again */ }
    live("reconnecting...");
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function startJob() {
  if (!startBar()) return;
  const id = jobId();
  const button = document.getElementById("cancel");
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const response = await api(`/api/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
      live(response.ok ? "cancel requested" : "cancel refused: " + response.status);
    } catch (error) {
      live("cancel failed: " + error.message);
    }
  });
  follow(id);
}

// The list of jobs -------------------------------------------------------------------------------------
async function refreshList() {
  const response = await api("/api/jobs");
  if (!response.ok) { live("refused: " + response.status); return; }
  const jobs = await response.json();
  const rows = jobs.map((job) => el("tr", { "data-job": job.job_id }, [
    el("td", {}, [el("a", { cls: "mono", href: "/jobs/" + encodeURIComponent(job.job_id), text: job.job_id })]),
    el("td", {}, [el("span", { cls: "badge state-" + job.state, text: job.state })]),
    el("td", { text: job.team }),
    el("td", { cls: "task-cell", text: job.task }),
    el("td", { cls: "muted", text: job.winner ? `${job.winner} won` : job.phase }),
    el("td", { cls: "muted", text: new Date(job.created_at * 1000).toLocaleString() }),
  ]));
  document.querySelector("#jobs tbody").replaceChildren(...rows);
  document.getElementById("empty").hidden = jobs.length > 0;
  live("updated " + new Date().toLocaleTimeString());
}

function startList() {
  if (!startBar()) return;
  const refresh = () => refreshList().catch((error) => { if (!(error instanceof SignedOut)) live("refresh failed"); });
  refresh();
  setInterval(refresh, 3000);
}

// Sign in --------------------------------------------------------------------------------------------------
// A one-time link (?code=) is swapped at once for a code only this page holds (the link's, also in the
// browser's command line, dies), shown with the caller it names, and used only when the user confirms
// here on this origin: a page elsewhere that sends the browser to such a link cannot replace a session.
// The page asked for (?next=) goes to the server, which answers with a URL of this origin only, read
// as the browser reads it (web/auth.py `landing`); the tab goes there only if it is this origin's.
function wantedPage(answer) {
  try {
    const target = new URL(answer.next || "/", location.origin);
    return target.origin === location.origin ? target.href : "/";
  } catch (error) {
    return "/";
  }
}

async function postSignIn(body) {
  const next = new URLSearchParams(location.search).get("next") || "/";
  const response = await fetch("/api/sign-in", {
    method: "POST", credentials: "omit", cache: "no-store",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ ...body, next }),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || "sign-in refused: " + response.status);
  return answer;
}

function problem(text) {
  const node = document.getElementById("problem");
  node.textContent = text;
  node.hidden = !text;
}

function signedIn(answer) {
  sessionStorage.setItem(SESSION, JSON.stringify({ key: answer.session, caller: answer.caller }));
  location.replace(wantedPage(answer));
}

async function startLogin() {
  const params = new URLSearchParams(location.search);
  const code = params.get("code");
  if (code) {  // out of the address bar and the history at once; kept in this function only
    params.delete("code");
    history.replaceState(null, "", "/login" + (params.toString() ? "?" + params : ""));
    try {
      const named = await postSignIn({ code, confirm: false });  // the link's code dies here
      setText("confirm-caller", named.caller);
      const current = session();
      if (current && current.caller) {
        setText("current-caller", current.caller);
        document.getElementById("replaces").hidden = false;
      }
      document.getElementById("confirm").hidden = false;
      document.getElementById("confirm-button").addEventListener("click", async () => {
        try { signedIn(await postSignIn({ code: named.code, confirm: true })); } catch (error) { problem(error.message); }
      }, { once: true });
    } catch (error) {
      problem(error.message);
    }
  }
  document.getElementById("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      signedIn(await postSignIn({ token: document.getElementById("token").value }));
    } catch (error) {
      problem(error.message);
    }
  });
}

const STARTS = { job: startJob, list: startList, login: startLogin };
(STARTS[document.body.dataset.page] || (() => {}))();
