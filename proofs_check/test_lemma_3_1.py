"""THEORY.md §2, Lemma 3.1: replacing one agent changes the team divergence only where that
agent acts (state level), and a message's KL is the expected sum of its per-token KLs
(token level, all messages enumerated, 1e-9)."""

from hypothesis import given
from hypothesis import strategies as st

from proofs_check.lemma_3_1 import lemma_3_1_state_slack, message_chain_rule_slack
from proofs_check.strategies import message_pairs, tabular_mdps, team_tables


@given(st.data(), tabular_mdps())
def test_team_divergence_is_agent_divergence_on_its_states(data, mdp):
    team = data.draw(team_tables(mdp))
    agent = data.draw(st.integers(0, mdp.n_agents - 1))
    target = data.draw(team_tables(mdp))
    assert lemma_3_1_state_slack(mdp, team, agent, target) >= 0


@given(message_pairs())
def test_message_kl_is_expected_sum_of_token_kls(pair):
    assert message_chain_rule_slack(pair) >= 0
