package ai.enterprise.sdk;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Optional;

/** One page of a list: its rows and the cursor of the next page (empty at the end). */
public record Page(List<JsonNode> results, Optional<String> nextCursor) {}
