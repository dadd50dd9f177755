// The JSON forms of RoundState and RoundEnd: what the store holds under
// /ddprun/<run_id>/state and /ddprun/<run_id>/round_<r>/end.

#include <nlohmann/json.hpp>

#include "ddp/elastic/round_state.hpp"
#include "run_keys.hpp"

namespace ddp::elastic {
namespace {

using nlohmann::json;

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kOpen:
      return "open";
    case Phase::kRunning:
      return "running";
    case Phase::kFinished:
      return "finished";
  }
  return "open";
}

Phase phase_of(const std::string& name) {
  if (name == "open") return Phase::kOpen;
  if (name == "running") return Phase::kRunning;
  if (name == "finished") return Phase::kFinished;
  throw RendezvousError("unknown rendezvous phase '" + name + "'");
}

const char* kind_name(StopReason::Kind kind) {
  switch (kind) {
    case StopReason::Kind::kWorkerFailed:
      return "worker_failed";
    case StopReason::Kind::kHung:
      return "hung";
    case StopReason::Kind::kNodeLost:
      return "node_lost";
    case StopReason::Kind::kNodeJoined:
      return "node_joined";
    case StopReason::Kind::kNodeLeft:
      return "node_left";
  }
  return "worker_failed";
}

StopReason::Kind kind_of(const std::string& name) {
  for (auto kind :
       {StopReason::Kind::kWorkerFailed, StopReason::Kind::kHung, StopReason::Kind::kNodeLost,
        StopReason::Kind::kNodeJoined, StopReason::Kind::kNodeLeft}) {
    if (name == kind_name(kind)) return kind;
  }
  throw RendezvousError("unknown stop reason '" + name + "'");
}

// A node as an array, [id, host, addr, local_world_size, role, worker_store_port] and the
// fixed group rank when set: the state of a round of 1,000 nodes is read by each of them, and
// an array parses in a fraction of an object's time and memory.
json participant_json(const Participant& node) {
  json out = json::array({node.node_id, node.host, node.addr, node.local_world_size, node.role,
                          node.worker_store_port});
  if (node.fixed_group_rank) out.push_back(*node.fixed_group_rank);
  return out;
}

Participant participant_of(const json& in) {
  if (!in.is_array() || in.size() < 6) {
    throw RendezvousError(
        "a node in the rendezvous state is not [id, host, addr, "
        "local_world_size, role, worker_store_port]");
  }
  Participant node;
  node.node_id = in[0].get<std::string>();
  node.host = in[1].get<std::string>();
  node.addr = in[2].get<std::string>();
  node.local_world_size = in[3].get<int>();
  node.role = in[4].get<std::string>();
  node.worker_store_port = in[5].get<int>();
  if (in.size() > 6) node.fixed_group_rank = in[6].get<int>();
  return node;
}

json nodes_json(const std::vector<Participant>& nodes) {
  json out = json::array();
  for (const auto& node : nodes) out.push_back(participant_json(node));
  return out;
}

std::vector<Participant> nodes_of(const json& in) {
  std::vector<Participant> nodes;
  for (const auto& node : in) nodes.push_back(participant_of(node));
  return nodes;
}

json parse(std::string_view text, const char* what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw RendezvousError(std::string("the rendezvous ") + what + " in the store is not JSON (" +
                          e.what() + "); is another program using the same --rdzv_id?");
  }
}

}  // namespace

std::string encode_state(const RoundState& state) {
  json out = {{"round", state.round},
              {"phase", phase_name(state.phase)},
              {"restart_count", state.restart_count},
              {"participants", nodes_json(state.participants)},
              {"wait_list", nodes_json(state.wait_list)},
              {"expected", state.expected},
              {"master_addr", state.master_addr},
              {"master_port", state.master_port}};
  if (state.phase == Phase::kOpen) {
    out["tender"] = state.tender;
    out["queued"] = state.queued;
  }
  return out.dump();
}

RoundState decode_state(std::string_view text) {
  json in = parse(text, "state");
  try {
    RoundState state;
    state.round = in.at("round").get<int>();
    state.phase = phase_of(in.at("phase").get<std::string>());
    state.restart_count = in.at("restart_count").get<int>();
    state.participants = nodes_of(in.at("participants"));
    state.wait_list = nodes_of(in.at("wait_list"));
    state.expected = in.at("expected").get<std::vector<std::string>>();
    state.master_addr = in.at("master_addr").get<std::string>();
    state.master_port = in.at("master_port").get<int>();
    state.tender = in.value("tender", std::string());
    state.queued = in.value("queued", 0);
    return state;
  } catch (const json::exception& e) {
    throw RendezvousError(std::string("the rendezvous state in the store is malformed: ") +
                          e.what());
  }
}

std::string encode_participant(const Participant& node) { return participant_json(node).dump(); }

Participant decode_participant(std::string_view text) {
  json in = parse(text, "join queue");
  try {
    return participant_of(in);
  } catch (const json::exception& e) {
    throw RendezvousError(std::string("a joiner in the rendezvous queue is malformed: ") +
                          e.what());
  }
}

std::string encode_end(const RoundEnd& end) {
  if (end.finished) return json{{"finished", true}}.dump();
  const StopReason& r = end.reason;
  json out = {{"kind", kind_name(r.kind)},
              {"node_id", r.node_id},
              {"host", r.host},
              {"rank", r.rank},
              {"local_rank", r.local_rank},
              {"pid", r.pid},
              {"exit_code", r.exit_code},
              {"signal", r.signal},
              {"message", r.message},
              {"error_file", r.error_file}};
  return out.dump();
}

RoundEnd decode_end(std::string_view text) {
  json in = parse(text, "round end");
  try {
    RoundEnd end;
    if (in.value("finished", false)) {
      end.finished = true;
      return end;
    }
    StopReason& r = end.reason;
    r.kind = kind_of(in.at("kind").get<std::string>());
    r.node_id = in.at("node_id").get<std::string>();
    r.host = in.at("host").get<std::string>();
    r.rank = in.at("rank").get<int>();
    r.local_rank = in.at("local_rank").get<int>();
    r.pid = in.at("pid").get<int>();
    r.exit_code = in.at("exit_code").get<int>();
    r.signal = in.at("signal").get<int>();
    r.message = in.at("message").get<std::string>();
    r.error_file = in.at("error_file").get<std::string>();
    return end;
  } catch (const json::exception& e) {
    throw RendezvousError(std::string("a round end in the rendezvous store is malformed: ") +
                          e.what());
  }
}

int round_closed_by(std::string_view key, std::string_view value) {
  if (RunKeys::is_state(key)) {
    try {
      const RoundState state = decode_state(value);
      return state.phase == Phase::kOpen ? 0 : state.round;
    } catch (const std::exception&) {
      return 0;  // not a state of ours
    }
  }
  return RunKeys::closed_round(key);
}

}  // namespace ddp::elastic
