"""The store's schema, as numbered migrations: each runs once, in order, and a new one is appended.

jobs/store/sql.py runs the ones a database has not seen (its `user_version` counts them)."""

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        task TEXT NOT NULL,
        team_name TEXT NOT NULL,
        team_json TEXT NOT NULL,
        state TEXT NOT NULL,
        phase TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        owner_pid INTEGER NOT NULL,
        owner_id TEXT NOT NULL,
        heartbeat REAL NOT NULL,
        progress_json TEXT,
        result_json TEXT,
        error TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        rev INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_state ON jobs(state);
    CREATE TABLE events (
        job_id TEXT NOT NULL REFERENCES jobs(id),
        seq INTEGER NOT NULL,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        letter TEXT,
        data_json TEXT NOT NULL,
        PRIMARY KEY (job_id, seq)
    );
    CREATE TABLE answers (
        job_id TEXT NOT NULL REFERENCES jobs(id),
        label TEXT NOT NULL,
        letter TEXT NOT NULL,
        revision INTEGER NOT NULL,
        content TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (job_id, label)
    );
    CREATE TABLE votes (
        job_id TEXT NOT NULL REFERENCES jobs(id),
        seq INTEGER NOT NULL,
        voter TEXT NOT NULL,
        label TEXT NOT NULL,
        reason TEXT NOT NULL,
        valid INTEGER NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (job_id, seq)
    );
    CREATE TABLE usage (
        job_id TEXT NOT NULL REFERENCES jobs(id),
        letter TEXT NOT NULL,
        model TEXT NOT NULL,
        calls INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cached_input_tokens INTEGER NOT NULL,
        cost_usd REAL,
        PRIMARY KEY (job_id, letter)
    );
    """,
    """
    ALTER TABLE jobs ADD COLUMN options_json TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE jobs ADD COLUMN files_json TEXT
    """,
    # a team's past jobs, for estimates and list_teams' typical usage (team_usage)
    "CREATE INDEX jobs_team ON jobs(team_name, state, created_at)",
    # a follow-up names the job it continues (conversations.py: conversations and steering notes)
    """
    ALTER TABLE jobs ADD COLUMN follow_up TEXT;
    CREATE INDEX IF NOT EXISTS jobs_follow_up ON jobs(follow_up)
    """,
    # who started the job: `local` (the CLI and stdio) or an HTTP token's caller name (app/tokens.py)
    "ALTER TABLE jobs ADD COLUMN caller TEXT NOT NULL DEFAULT 'local'",
    # the tokens an agent's cost does not cover (backends/base.py `Usage`); 0 for older rows, whose cost
    # was recorded only when it covered every token
    "ALTER TABLE usage ADD COLUMN uncosted_tokens INTEGER NOT NULL DEFAULT 0",
    # the job as the caller asked for it (jobs/request.py); a job stored before has none (sql.py reads
    # it from the task and the options of then)
    "ALTER TABLE jobs ADD COLUMN request_json TEXT",
    # a job's lease (jobs/upkeep/maintenance.py): its owner holds it until lease_until, renewed by the
    # heartbeat; NULL for older rows (their heartbeat plus CONCLAVE_STALE_AFTER_S); owner_host, where the
    # owner's process id means something (NULL: this machine, as before). The protocol's journal
    # (coordination/journal.py): every event the protocol took, so another process resumes the job.
    """
    ALTER TABLE jobs ADD COLUMN lease_until REAL;
    ALTER TABLE jobs ADD COLUMN owner_host TEXT;
    CREATE TABLE IF NOT EXISTS protocol_events (
        job_id TEXT NOT NULL REFERENCES jobs(id),
        seq INTEGER NOT NULL,
        event_json TEXT NOT NULL,
        PRIMARY KEY (job_id, seq)
    )
    """,
    # of an agent's input tokens, those estimated for calls that reported nothing (backends/base.py
    # `Usage`); 0 for older rows
    "ALTER TABLE usage ADD COLUMN estimated_input_tokens INTEGER NOT NULL DEFAULT 0",
)
