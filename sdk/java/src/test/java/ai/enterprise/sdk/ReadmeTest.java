package ai.enterprise.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;

/** Every complete program of README.md, compiled and run against the live gateway. */
class ReadmeTest {
  @Test
  void readmeExamplesWorkWhenCopied() throws Exception {
    ScenariosTest.Config cfg = ScenariosTest.config();
    String readme = Files.readString(Path.of("README.md"));
    Matcher m = Pattern.compile("(?s)```java\n(.*?)```").matcher(readme);
    String classpath = System.getenv("EAI_SDK_JAVA_CLASSES") + File.pathSeparator + System.getProperty("java.class.path");
    int ran = 0;
    while (m.find()) {
      String source = m.group(1);
      Matcher name = Pattern.compile("public class (\\w+)").matcher(source);
      if (!name.find()) {
        continue;
      }
      Path dir = Files.createTempDirectory("eai-readme");
      Path file = dir.resolve(name.group(1) + ".java");
      Files.writeString(file, source);
      int compiled = ToolProvider.getSystemJavaCompiler()
          .run(null, null, null, "-cp", classpath, "-d", dir.toString(), file.toString());
      assertEquals(0, compiled, "README example does not compile");
      List<String> command = new ArrayList<>(List.of(
          Path.of(System.getProperty("java.home"), "bin", "java").toString(),
          "-cp", dir + File.pathSeparator + classpath, name.group(1)));
      ProcessBuilder pb = new ProcessBuilder(command).redirectErrorStream(true);
      pb.environment().put("EAI_BASE_URL", cfg.baseUrl());
      pb.environment().put("EAI_API_KEY", cfg.keys().get("agent"));
      Process process = pb.start();
      String out = new String(process.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertEquals(0, process.waitFor(), out);
      assertTrue(out.contains("succeeded") && out.contains("policy_denied"), out);
      ran++;
    }
    assertTrue(ran > 0, "no complete program in README.md");
  }
}
