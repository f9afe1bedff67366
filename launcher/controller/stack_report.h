// The stacks of every worker of a job, captured, saved and judged: what the controller runs
// when a stall has no cheaper culprit, and what `keel-ctl stacks` asks for. The capture is
// the host's (launcher/controller/rank_host.h: the agents, or LocalHost itself); the judgement is
// robust/stack_groups.h's.
#pragma once

#include <chrono>
#include <string>

#include "launcher/controller/rank_host.h"
#include "launcher/stack_capture.h"
#include "proto/control.pb.h"
#include "robust/stack_groups.h"

namespace keel {

// Captures every rank's stacks through `host` (within about `timeout`), writes
// dir/rank<R>.txt for each rank and dir/summary.txt (the verdict and the groups), and
// returns what keel-ctl prints: ok, the directory, the culprit ranks and the summary.
// `dir` is runs/<job>/stacks/<incident or name>/, created if missing. Never throws for what
// the workers or the disk do: ok is false and `message` says why.
control::StacksReply collect_stacks(RankHost& host, const std::string& dir,
                                    std::chrono::milliseconds timeout);

// What robust/stack_groups.h compares: the message's threads, the main one marked.
RankThreads to_rank_threads(const control::RankStacks& msg);

}  // namespace keel
