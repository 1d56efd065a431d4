# The gateway's default policy for decision `tool.invoke`.
#
# Input: {principal: {key_id, agent, scopes, tenant}, tool: {name, version,
# scopes_required, requires_approval, risk_class, action_class, network, ...},
# request: {run_id, step_index, input_digest}, context: {request_id, time}}.
#
# A tenant's `kind: Policy` manifests add rules to this package: more `deny` reasons or
# more `obligations`. Denials always win.
package eai.tool

import rego.v1

required_scopes := array.concat(["tools:invoke"], object.get(input.tool, "scopes_required", []))

missing_scopes contains scope if {
	some scope in required_scopes
	not scope in input.principal.scopes
}

deny contains sprintf("missing scope '%s'", [scope]) if {
	some scope in missing_scopes
}

obligations contains {"type": "require_approval", "reason": "the tool requires approval"} if {
	input.tool.requires_approval == true
}

obligations contains {"type": "require_approval", "reason": "critical risk class"} if {
	input.tool.risk_class == "critical"
}

decision := {
	"allow": count(deny) == 0,
	"reasons": sort(deny),
	"missing_scopes": sort(missing_scopes),
	"obligations": obligations,
}
